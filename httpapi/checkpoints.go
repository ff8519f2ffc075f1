package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
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

// checkpointRoutes serve /v1/checkpoints/... and the internal routes nodes
// use between themselves (/v1/internal/checkpoints/...: a node's own copies).
// A part's PUT and a commit are streamed routes: the part is read straight
// into the memory it is kept in and passed on to the partner as it arrives.
type checkpointRoutes struct{ s *Server } // s.ckpt is set after the table is built

// served wraps a checkpoint handler: 404 while this node serves none, and
// the step parsed for the routes that name one.
func (c checkpointRoutes) served(h func(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, step uint64)) handler {
	return func(ctx *fasthttp.RequestCtx, p params) {
		ck := c.s.ckpt
		if ck == nil {
			writeError(ctx, fasthttp.StatusNotFound, "checkpoints are not served by this node")
			ctx.SetConnectionClose()
			return
		}
		var step uint64
		if strings.Contains(p.r.pattern, "{step}") {
			v, err := p.get("step"), error(nil)
			if step, err = strconv.ParseUint(v, 10, 64); err != nil {
				writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("step %q: want a non-negative integer", v))
				return
			}
		}
		h(ctx, ck, p, step)
	}
}

func (checkpointRoutes) list(ctx *fasthttp.RequestCtx, ck Checkpoints, _ params, _ uint64) {
	writeJSON(ctx, 200, ck.List())
}

func (checkpointRoutes) get(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, _ uint64) {
	c, err := ck.Get(p.get("checkpoint"))
	if err != nil {
		failCheckpoint(ctx, err)
		return
	}
	writeJSON(ctx, 200, c)
}

func (checkpointRoutes) delete(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, _ uint64) {
	rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := ck.Delete(rctx, p.get("checkpoint"), relayed(ctx)); err != nil {
		failCheckpoint(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

func (checkpointRoutes) uploads(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, step uint64) {
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	up, err := ck.Uploads(rctx, p.get("checkpoint"), step)
	if err != nil {
		failCheckpoint(ctx, err)
		return
	}
	writeJSON(ctx, 200, up)
}

// dropLocal, held, putReplica, getLocal and copy are the internal routes.

func (checkpointRoutes) dropLocal(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, _ uint64) {
	writeJSON(ctx, 200, ck.DropLocal(p.get("checkpoint")))
}

func (checkpointRoutes) held(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, step uint64) {
	writeJSON(ctx, 200, ck.Held(p.get("checkpoint"), step))
}

func (checkpointRoutes) copy(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, step uint64) {
	to := string(ctx.QueryArgs().Peek("to"))
	rctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := ck.CopyTo(rctx, p.get("checkpoint"), step, p.get("part"), to); err != nil {
		failCheckpoint(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

func (checkpointRoutes) putPart(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, step uint64) {
	putPart(ctx, ck, p.get("checkpoint"), step, p.get("part"), false)
}

func (checkpointRoutes) putReplica(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, step uint64) {
	putPart(ctx, ck, p.get("checkpoint"), step, p.get("part"), true)
}

func (checkpointRoutes) getPart(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, step uint64) {
	getPart(ctx, ck, p.get("checkpoint"), step, p.get("part"), false)
}

func (checkpointRoutes) getLocal(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, step uint64) {
	getPart(ctx, ck, p.get("checkpoint"), step, p.get("part"), true)
}

func (checkpointRoutes) commit(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, step uint64) {
	commitCheckpoint(ctx, ck, p.get("checkpoint"), step)
}

func putPart(ctx *fasthttp.RequestCtx, ck Checkpoints, name string, step uint64, part string, internal bool) {
	req := checkpoint.PutRequest{Name: name, Step: step, Part: part, Replica: internal,
		Repair: internal && string(ctx.QueryArgs().Peek("repair")) == "1",
		Sum:    string(ctx.Request.Header.Peek(api.HeaderChecksum)), Size: int64(ctx.Request.Header.ContentLength())}
	var body io.Reader
	if ctx.Request.IsBodyStream() {
		body = ctx.RequestBodyStream()
	} else {
		body = bytes.NewReader(ctx.PostBody())
	}
	if err := ck.Put(context.Background(), req, body); err != nil {
		failCheckpoint(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusCreated)
}

func getPart(ctx *fasthttp.RequestCtx, ck Checkpoints, name string, step uint64, part string, internal bool) {
	p, err := ck.Open(context.Background(), name, step, part, internal)
	if err != nil {
		failCheckpoint(ctx, err)
		return
	}
	ctx.Response.Header.Set(api.HeaderChecksum, p.Sum)
	ctx.Response.Header.Set("X-Checkpoint-From", p.From)
	ctx.SetContentType("application/octet-stream")
	ctx.SetBodyStream(p, int(p.Size)) // fasthttp closes p after the last byte
}

func commitCheckpoint(ctx *fasthttp.RequestCtx, ck Checkpoints, name string, step uint64) {
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
	st, err := ck.Commit(rctx, name, step, req, relayed(ctx))
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
