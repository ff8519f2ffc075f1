package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/bufpool"
	"stallfree/catalog"
	"stallfree/checkpoint"
)

// Checkpoints is what the checkpoint routes need (checkpoint.Service).
type Checkpoints interface {
	Put(ctx context.Context, req checkpoint.PutRequest, body io.Reader) error
	Commit(ctx context.Context, name string, step uint64, req api.CommitCheckpoint, relayed bool) (api.CheckpointStep, error)
	Open(ctx context.Context, name string, step uint64, part string, localOnly bool) (*checkpoint.Part, error)
	MapLocal(name string, step uint64, part string) (checkpoint.Mapped, bool)
	List() []api.Checkpoint
	Get(name string) (api.Checkpoint, error)
	Uploads(ctx context.Context, name string, step uint64) (api.CheckpointUpload, error)
	Held(name string, step uint64, forCommit bool) []checkpoint.HeldPart
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
// route's limit with 413 as the parser did before bodies were streamed, and
// one that MaxBodyBytes has no room for with 503, before reading it. The
// caller calls release once done with the body. With a pool, a body of
// known length is read into a buffer from it, which release takes back
// (and the request lets go of): nothing may hold the body past release.
func (s *Server) readBody(ctx *fasthttp.RequestCtx, limit int, pool *bufpool.Pool) (release func(), ok bool) {
	if !ctx.Request.IsBodyStream() {
		return func() {}, true
	}
	tooLarge := func() (func(), bool) {
		// Read (and drop) what the client is still sending, up to a bound,
		// before answering: a client still writing when the connection closes
		// gets a reset instead of the 413.
		io.Copy(io.Discard, io.LimitReader(ctx.RequestBodyStream(), maxTooLargeDrain))
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", limit))
		ctx.SetConnectionClose() // whatever is past the bound is never read
		return nil, false
	}
	if ctx.Request.Header.ContentLength() > limit {
		return tooLarge()
	}
	// Charged before a byte is read: the body's length, or for a chunked
	// one its route's limit, which is all it may grow to.
	charge := int64(limit)
	if n := ctx.Request.Header.ContentLength(); n >= 0 {
		charge = int64(n)
		if pool != nil {
			charge = int64(pool.Held(n)) // a recycled buffer is its class's size, up to twice the body
		}
	}
	charge = min(charge, s.MaxBodyBytes) // a body larger than the bound is read alone
	if !s.bodies.TryAcquire(charge) {
		// Drained into nothing (no memory held), as a body too large is,
		// so that a client still sending reads the 503 and its Retry-After
		// rather than a reset; past the bound the connection is closed.
		io.Copy(io.Discard, io.LimitReader(ctx.RequestBodyStream(), maxTooLargeDrain))
		writeError(ctx, fasthttp.StatusServiceUnavailable, fmt.Sprintf("request bodies of %d bytes in all are being read on this node (--max-body-bytes); retry", s.MaxBodyBytes))
		ctx.Response.Header.Set("Retry-After", "1") // writeError resets the response
		ctx.SetConnectionClose()
		return nil, false
	}
	s.bodyBytes.Add(charge)
	release = func() {
		s.bodyBytes.Add(-charge)
		s.bodies.Release(charge)
	}
	var (
		b   []byte
		err error
	)
	if n := ctx.Request.Header.ContentLength(); n >= 0 {
		// The length is known (and within the limit): one buffer of that
		// size, filled in place, where io.ReadAll would grow one by doubling
		// and copy the body several times over (a derived item's PUT spent
		// more in those copies than in storing it).
		if pool != nil {
			pb := pool.Get(n)
			charged := release
			release = func() {
				ctx.Request.SetBodyRaw(nil)
				pool.Put(pb)
				charged()
			}
			b = pb.B
		} else {
			b = make([]byte, n)
		}
		_, err = io.ReadFull(s.bodyStream(ctx), b)
	} else {
		b, err = io.ReadAll(io.LimitReader(s.bodyStream(ctx), int64(limit)+1))
	}
	if err != nil {
		release()
		writeError(ctx, fasthttp.StatusBadRequest, "reading the request body: "+err.Error())
		ctx.SetConnectionClose()
		return nil, false
	}
	if len(b) > limit {
		release()
		return tooLarge()
	}
	ctx.Request.SetBodyRaw(b)
	return release, true
}

// bodyStream is a streamed request body that fails when no byte arrives for
// IdleTimeout, not after a total time: a large part on a slow link
// takes as long as it takes while it makes progress, and a silent sender
// is cut off. Every body a route reads goes through it.
func (s *Server) bodyStream(ctx *fasthttp.RequestCtx) io.Reader {
	if !ctx.Request.IsBodyStream() {
		return bytes.NewReader(ctx.PostBody())
	}
	return progressReader{r: ctx.RequestBodyStream(), conn: ctx.Conn(), idle: s.IdleTimeout}
}

// progressReader moves the connection's read deadline before each read.
type progressReader struct {
	r    io.Reader
	conn net.Conn
	idle time.Duration
}

func (p progressReader) Read(b []byte) (int, error) {
	if p.idle > 0 {
		p.conn.SetReadDeadline(time.Now().Add(p.idle))
	}
	return p.r.Read(b)
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
	writeJSON(ctx, 200, ck.Held(p.get("checkpoint"), step, string(ctx.QueryArgs().Peek("commit")) == "1"))
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

func (c checkpointRoutes) putPart(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, step uint64) {
	putPart(ctx, ck, c.s.bodyStream(ctx), p.get("checkpoint"), step, p.get("part"), false)
}

func (c checkpointRoutes) putReplica(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, step uint64) {
	putPart(ctx, ck, c.s.bodyStream(ctx), p.get("checkpoint"), step, p.get("part"), true)
}

func (checkpointRoutes) getPart(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, step uint64) {
	getPart(ctx, ck, p.get("checkpoint"), step, p.get("part"), false)
}

func (checkpointRoutes) getLocal(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, step uint64) {
	getPart(ctx, ck, p.get("checkpoint"), step, p.get("part"), true)
}

func (c checkpointRoutes) commit(ctx *fasthttp.RequestCtx, ck Checkpoints, p params, step uint64) {
	commitCheckpoint(ctx, ck, c.s.bodyStream(ctx), p.get("checkpoint"), step)
}

func putPart(ctx *fasthttp.RequestCtx, ck Checkpoints, body io.Reader, name string, step uint64, part string, internal bool) {
	req := checkpoint.PutRequest{Name: name, Step: step, Part: part, Replica: internal,
		Repair: internal && string(ctx.QueryArgs().Peek("repair")) == "1",
		Sum:    string(ctx.Request.Header.Peek(api.HeaderChecksum)), Size: int64(ctx.Request.Header.ContentLength())}
	if err := ck.Put(context.Background(), req, body); err != nil {
		failCheckpoint(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusCreated)
}

func getPart(ctx *fasthttp.RequestCtx, ck Checkpoints, name string, step uint64, part string, internal bool) {
	if !internal && string(ctx.QueryArgs().Peek("map")) == "1" {
		// A rank on this host maps the node's own copy: no byte crosses
		// the socket. When there is nothing to map (not held here, not in
		// shared memory, a caller on another host) nothing is sent either:
		// 204, and the caller fetches the bytes without ?map.
		// Asked only over the socket: a mapping handed out is never reused.
		m, ok := checkpoint.Mapped{}, false
		if overUnixSocket(ctx) {
			m, ok = ck.MapLocal(name, step, part)
		}
		if !ok {
			ctx.SetStatusCode(fasthttp.StatusNoContent)
			return
		}
		var st syscall.Stat_t
		if err := syscall.Stat(m.Path, &st); err != nil { // dropped since: fetch it
			ctx.SetStatusCode(fasthttp.StatusNoContent)
			return
		}
		ctx.Response.Header.Set(api.HeaderChecksum, m.Sum)
		ctx.Response.Header.Set("X-Checkpoint-From", "memory")
		ctx.Response.Header.Set(api.HeaderCheckpointMap, m.Path)
		ctx.Response.Header.Set(api.HeaderCheckpointMapSize, strconv.FormatInt(m.Size, 10))
		ctx.Response.Header.Set(api.HeaderCheckpointMapIno, strconv.FormatUint(st.Ino, 10))
		ctx.Response.Header.Set(api.HeaderCheckpointMapDev, strconv.FormatUint(uint64(st.Dev), 10))
		ctx.SetStatusCode(fasthttp.StatusOK)
		return
	}
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

func commitCheckpoint(ctx *fasthttp.RequestCtx, ck Checkpoints, r io.Reader, name string, step uint64) {
	if ctx.Request.Header.ContentLength() > MaxBodySize {
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, fmt.Sprintf("commit body over %d bytes", MaxBodySize))
		return
	}
	body, err := io.ReadAll(io.LimitReader(r, MaxBodySize+1))
	switch {
	case err != nil:
		writeError(ctx, fasthttp.StatusBadRequest, "reading the commit body: "+err.Error())
		return
	case len(body) > MaxBodySize:
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, fmt.Sprintf("commit body over %d bytes", MaxBodySize))
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
