package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/checkpoint"
)

// Checkpoints is what the checkpoint routes need (checkpoint.Service).
type Checkpoints interface {
	Put(ctx context.Context, req checkpoint.PutRequest, body io.Reader) error
	Commit(ctx context.Context, name string, step uint64, req api.CommitCheckpoint, relayed bool) (api.CheckpointStep, error)
	Open(ctx context.Context, name string, step uint64, part string, localOnly bool) (*checkpoint.Part, error)
	List() []api.Checkpoint
	Get(name string) (api.Checkpoint, error)
	Uploads(ctx context.Context, name string, step uint64) (api.CheckpointUpload, error)
	Held(name string, step uint64) []checkpoint.HeldPart
	Delete(ctx context.Context, name string, relayed bool) error
	CopyTo(ctx context.Context, name string, step uint64, part, addr string) error
	DropLocal(name string) int
	Stats() api.CheckpointStats
}

// SetCheckpoints serves the checkpoint routes with c; set it before Serve.
func (s *Server) SetCheckpoints(c Checkpoints) { s.ckpt = c }

func (s *Server) checkpointStats() *api.CheckpointStats {
	if s.ckpt == nil {
		return nil
	}
	st := s.ckpt.Stats()
	return &st
}

// streamed routes checkpoint requests before anything reads their bodies:
// the server streams request bodies (StreamRequestBody), so a part is read
// straight into the memory it is kept in and passed on to the partner as it
// arrives. Every other route gets its body read whole, bounded as before.
func (s *Server) streamed(next fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		var segs [16]string
		_, seg := splitPath(ctx.URI().PathOriginal(), segs[:0])
		if len(seg) >= 2 && seg[0] == "v1" && (seg[1] == "checkpoints" || len(seg) >= 3 && seg[1] == "internal" && seg[2] == "checkpoints") {
			s.checkpoints(ctx, seg[1:])
			return
		}
		if !s.readBody(ctx, s.bodyLimit(seg)) {
			return
		}
		next(ctx)
	}
}

// readBody reads a streamed request body whole, refusing one over the
// server's limit with 413 as the parser did before bodies were streamed.
func (s *Server) readBody(ctx *fasthttp.RequestCtx, limit int) bool {
	if !ctx.Request.IsBodyStream() {
		return true
	}
	tooLarge := func() bool {
		// Read (and drop) what the client is still sending, up to a bound,
		// before answering: a client still writing when the connection closes
		// gets a reset instead of the 413.
		io.Copy(io.Discard, io.LimitReader(ctx.RequestBodyStream(), maxTooLargeDrain))
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", limit))
		ctx.SetConnectionClose() // whatever is past the bound is never read
		return false
	}
	if ctx.Request.Header.ContentLength() > limit {
		return tooLarge()
	}
	b, err := io.ReadAll(io.LimitReader(ctx.RequestBodyStream(), int64(limit)+1))
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, "reading the request body: "+err.Error())
		ctx.SetConnectionClose()
		return false
	}
	if len(b) > limit {
		return tooLarge()
	}
	ctx.Request.SetBodyRaw(b)
	return true
}

// maxTooLargeDrain bounds what is read of a body refused as too large.
const maxTooLargeDrain = 64 << 20

// maxDrain bounds what is read of a refused part's body.
const maxDrain = 4 << 30

// checkpoints serves /v1/checkpoints/... and the internal routes nodes use
// between themselves (/v1/internal/checkpoints/...: a node's own copies).
// seg starts at "checkpoints" or "internal".
func (s *Server) checkpoints(ctx *fasthttp.RequestCtx, seg []string) {
	if !s.authorized(ctx) {
		ctx.Response.Header.Set("WWW-Authenticate", "Bearer")
		writeError(ctx, fasthttp.StatusUnauthorized, "missing or wrong bearer token")
		ctx.SetConnectionClose()
		return
	}
	if s.ckpt == nil {
		writeError(ctx, fasthttp.StatusNotFound, "checkpoints are not served by this node")
		ctx.SetConnectionClose()
		return
	}
	internal := seg[0] == "internal"
	if internal {
		seg = seg[1:]
	}
	seg = seg[1:] // after "checkpoints"
	method := string(ctx.Method())
	// A refused upload may leave its body unread. Read the rest (bounded)
	// before answering: a client still sending when the server closes gets
	// a reset instead of the answer (a 507 would arrive as a broken pipe).
	defer func() {
		if ctx.Request.IsBodyStream() && ctx.Response.StatusCode() >= 300 {
			if _, err := io.CopyN(io.Discard, ctx.RequestBodyStream(), maxDrain); err != io.EOF {
				ctx.SetConnectionClose()
			}
		}
	}()
	if len(seg) == 0 {
		if method != fasthttp.MethodGet || internal {
			methodNotAllowed(ctx)
			return
		}
		writeJSON(ctx, 200, s.ckpt.List())
		return
	}
	name := seg[0]
	if len(seg) == 1 && internal && method == fasthttp.MethodDelete {
		writeJSON(ctx, 200, s.ckpt.DropLocal(name))
		return
	}
	if len(seg) == 1 && !internal {
		switch method {
		case fasthttp.MethodGet:
			ck, err := s.ckpt.Get(name)
			if err != nil {
				failCheckpoint(ctx, err)
				return
			}
			writeJSON(ctx, 200, ck)
		case fasthttp.MethodDelete:
			rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := s.ckpt.Delete(rctx, name, relayed(ctx)); err != nil {
				failCheckpoint(ctx, err)
				return
			}
			ctx.SetStatusCode(fasthttp.StatusNoContent)
		default:
			methodNotAllowed(ctx)
		}
		return
	}
	if len(seg) < 3 || seg[1] != "steps" {
		writeError(ctx, fasthttp.StatusNotFound, "no such route")
		return
	}
	step, err := strconv.ParseUint(seg[2], 10, 64)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("step %q: want a non-negative integer", seg[2]))
		return
	}
	rest := seg[3:]
	switch {
	case internal && len(rest) == 0 && method == fasthttp.MethodGet:
		writeJSON(ctx, 200, s.ckpt.Held(name, step))
	case !internal && len(rest) == 1 && rest[0] == "commit" && method == fasthttp.MethodPost:
		s.commitCheckpoint(ctx, name, step)
	case !internal && len(rest) == 1 && rest[0] == "parts" && method == fasthttp.MethodGet:
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		up, err := s.ckpt.Uploads(rctx, name, step)
		if err != nil {
			failCheckpoint(ctx, err)
			return
		}
		writeJSON(ctx, 200, up)
	case len(rest) == 2 && rest[0] == "parts":
		switch method {
		case fasthttp.MethodPut:
			s.putPart(ctx, name, step, rest[1], internal)
		case fasthttp.MethodGet:
			s.getPart(ctx, name, step, rest[1], internal)
		default:
			methodNotAllowed(ctx)
		}
	case internal && len(rest) == 3 && rest[0] == "parts" && rest[2] == "copy" && method == fasthttp.MethodPost:
		to := string(ctx.QueryArgs().Peek("to"))
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if err := s.ckpt.CopyTo(rctx, name, step, rest[1], to); err != nil {
			failCheckpoint(ctx, err)
			return
		}
		ctx.SetStatusCode(fasthttp.StatusNoContent)
	default:
		writeError(ctx, fasthttp.StatusNotFound, "no such route")
	}
}

func (s *Server) putPart(ctx *fasthttp.RequestCtx, name string, step uint64, part string, internal bool) {
	req := checkpoint.PutRequest{Name: name, Step: step, Part: part, Replica: internal,
		Repair: internal && string(ctx.QueryArgs().Peek("repair")) == "1",
		Sum:    string(ctx.Request.Header.Peek(api.HeaderChecksum)), Size: int64(ctx.Request.Header.ContentLength())}
	var body io.Reader
	if ctx.Request.IsBodyStream() {
		body = ctx.RequestBodyStream()
	} else {
		body = bytes.NewReader(ctx.PostBody())
	}
	if err := s.ckpt.Put(context.Background(), req, body); err != nil {
		failCheckpoint(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusCreated)
}

func (s *Server) getPart(ctx *fasthttp.RequestCtx, name string, step uint64, part string, internal bool) {
	p, err := s.ckpt.Open(context.Background(), name, step, part, internal)
	if err != nil {
		failCheckpoint(ctx, err)
		return
	}
	ctx.Response.Header.Set(api.HeaderChecksum, p.Sum)
	ctx.Response.Header.Set("X-Checkpoint-From", p.From)
	ctx.SetContentType("application/octet-stream")
	ctx.SetBodyStream(p, int(p.Size)) // fasthttp closes p after the last byte
}

func (s *Server) commitCheckpoint(ctx *fasthttp.RequestCtx, name string, step uint64) {
	body, err := ctx.PostBody(), error(nil)
	if ctx.Request.IsBodyStream() {
		body, err = io.ReadAll(io.LimitReader(ctx.RequestBodyStream(), MaxBodySize+1))
	}
	if err != nil || len(body) > MaxBodySize {
		writeError(ctx, fasthttp.StatusBadRequest, "commit body unreadable or over 1 MiB")
		return
	}
	var req api.CommitCheckpoint
	if err := decodeStrict(body, &req); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	st, err := s.ckpt.Commit(rctx, name, step, req, relayed(ctx))
	if err != nil {
		failCheckpoint(ctx, err)
		return
	}
	writeJSON(ctx, 200, st)
}

// failCheckpoint maps the checkpoint service's errors to statuses.
func failCheckpoint(ctx *fasthttp.RequestCtx, err error) {
	var missing *checkpoint.MissingError
	switch {
	case errors.As(err, &missing):
		b, _ := json.Marshal(api.MissingParts{Error: err.Error(), Missing: missing.Parts})
		ctx.Response.Reset()
		ctx.SetStatusCode(fasthttp.StatusConflict)
		ctx.SetContentType("application/json")
		ctx.SetBody(b)
	case errors.Is(err, checkpoint.ErrBadRequest):
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
	case errors.Is(err, checkpoint.ErrLengthRequired):
		writeError(ctx, fasthttp.StatusLengthRequired, err.Error())
	case errors.Is(err, checkpoint.ErrNoRoom):
		writeError(ctx, fasthttp.StatusInsufficientStorage, err.Error())
	case errors.Is(err, checkpoint.ErrUnavailable):
		writeError(ctx, fasthttp.StatusServiceUnavailable, err.Error())
	case errors.Is(err, catalog.ErrConflict):
		writeError(ctx, fasthttp.StatusConflict, err.Error())
	case errors.Is(err, catalog.ErrNotFound):
		writeError(ctx, fasthttp.StatusNotFound, err.Error())
	default:
		fail(ctx, err)
	}
}
