package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/groups"
)

// maxGroupWait bounds ?wait= on group batch routes.
const maxGroupWait = 5 * time.Minute

// EnableGroups serves coordinated prep (/v1/groups) with g; call it before
// Serve.
func (s *Server) EnableGroups(g *groups.Service) {
	s.groups = g
}

// groupBodyLimit is the largest body a /v1/groups route takes: a staged
// batch may be as large as --max-item-bytes.
func (s *Server) groupBodyLimit() int {
	if s.groups == nil {
		return s.srv.MaxRequestBodySize
	}
	return max(s.srv.MaxRequestBodySize, s.groups.MaxBatchBytes())
}

// The /v1/groups routes (lines of the table, routes.go). They answer 404
// while coordinated prep is off (no EnableGroups).

func (s *Server) groupsOff(ctx *fasthttp.RequestCtx) bool {
	if s.groups == nil {
		writeError(ctx, fasthttp.StatusNotFound, "no such route")
		return true
	}
	return false
}

func (s *Server) groupList(ctx *fasthttp.RequestCtx, _ params) {
	if !s.groupsOff(ctx) {
		writeJSON(ctx, 200, s.groups.List())
	}
}

func (s *Server) groupGet(ctx *fasthttp.RequestCtx, p params) {
	if s.groupsOff(ctx) {
		return
	}
	rctx, cancel := reqContext(ctx, 30*time.Second)
	defer cancel()
	info, err := s.groups.Info(rctx, p.get("group"), relayedIndex(ctx))
	if err != nil {
		groupFail(ctx, err)
		return
	}
	writeJSON(ctx, 200, info)
}

func (s *Server) groupPut(ctx *fasthttp.RequestCtx, p params) {
	if s.groupsOff(ctx) {
		return
	}
	var spec api.GroupSpec
	if err := decodeStrict(ctx.PostBody(), &spec); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if err := validName("dataset", spec.Dataset); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	rctx, cancel := reqContext(ctx, 30*time.Second)
	defer cancel()
	info, created, err := s.groups.Put(rctx, p.get("group"), spec)
	if err != nil {
		groupFail(ctx, err)
		return
	}
	markApplied(ctx, s.relay)
	writeCreated(ctx, created, info)
}

func (s *Server) groupDelete(ctx *fasthttp.RequestCtx, p params) {
	if s.groupsOff(ctx) {
		return
	}
	rctx, cancel := reqContext(ctx, 30*time.Second)
	defer cancel()
	if err := s.groups.Delete(rctx, p.get("group")); err != nil {
		groupFail(ctx, err)
		return
	}
	markApplied(ctx, s.relay)
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// groupBatchRoute serves GET and PUT /v1/groups/{group}/epochs/{epoch}/batches/{batch}.
func (s *Server) groupBatchRoute(ctx *fasthttp.RequestCtx, p params) {
	if !s.groupsOff(ctx) {
		s.groupBatch(ctx, string(ctx.Method()), p.get("group"), p.get("epoch"), p.get("batch"))
	}
}

// groupBatch serves GET and PUT /v1/groups/{g}/epochs/{e}/batches/{b}?job=K
// at the group's owner; any other node relays the request there.
func (s *Server) groupBatch(ctx *fasthttp.RequestCtx, method, name, epochSeg, batchSeg string) {
	if method != fasthttp.MethodGet && method != fasthttp.MethodPut {
		methodNotAllowed(ctx)
		return
	}
	q := ctx.QueryArgs()
	def := time.Duration(0) // a reader asks; a producer waits for room by default
	if method == fasthttp.MethodPut {
		def = 30 * time.Second
	}
	wait, werr := parseWait(string(q.Peek("wait")), def)
	epoch, eerr := strconv.ParseUint(epochSeg, 10, 64)
	b, berr := strconv.Atoi(batchSeg)
	job, jerr := strconv.Atoi(string(q.Peek("job")))
	if err := errors.Join(werr, eerr, berr, jerr); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("epoch %q, batch %q, ?job=K (the job's index) and ?wait=DURATION: %v", epochSeg, batchSeg, err))
		return
	}
	if addr, self := s.groups.Owner(name); !self && !relayed(ctx) {
		s.relayToOwner(ctx, addr, wait)
		return
	}
	rctx, cancel := reqContext(ctx, wait+time.Second)
	defer cancel()
	bt := groups.Batch{Group: name, Job: job, Epoch: epoch, Index: b, After: relayedIndex(ctx)}
	if method == fasthttp.MethodPut {
		created, err := s.groups.PutBatch(rctx, bt, ctx.PostBody(), wait)
		if err != nil {
			groupFail(ctx, err)
			return
		}
		writeCreated(ctx, created, map[string]bool{"staged": created})
		return
	}
	data, producer, err := s.groups.Get(rctx, bt, wait)
	if err != nil {
		groupFail(ctx, err)
		if errors.Is(err, groups.ErrNotStaged) { // after groupFail, which resets the response
			ctx.Response.Header.Set(api.HeaderGroupProducer, strconv.Itoa(producer))
		}
		return
	}
	ctx.Response.Header.Set(api.HeaderGroupProducer, strconv.Itoa(producer))
	ctx.SetContentType("application/octet-stream")
	ctx.Response.SetBodyRaw(data) // staged bytes are never changed, only dropped
}

// relayToOwner hands a batch request to the group's owner and passes its
// answer back.
func (s *Server) relayToOwner(ctx *fasthttp.RequestCtx, addr string, wait time.Duration) {
	// What this node has applied: the owner waits for it before it says a
	// group defined through this node does not exist.
	h := http.Header{api.HeaderApplied: {strconv.FormatUint(s.relay.AppliedIndex(), 10)}}
	rctx, cancel := context.WithTimeout(context.Background(), wait+30*time.Second)
	defer cancel()
	limit := int64(max(MaxBodySize, s.groups.MaxBatchBytes()))
	if err := s.peers.Forward(rctx, addr, string(ctx.URI().RequestURI()), &ctx.Request, &ctx.Response, h, limit); err != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, fmt.Sprintf("the group's owner at %s: %v", addr, err))
	}
}

// relayedIndex is the raft index a relaying node had applied (0: the request
// was not relayed).
func relayedIndex(ctx *fasthttp.RequestCtx) uint64 {
	if !relayed(ctx) {
		return 0
	}
	idx, _ := strconv.ParseUint(string(ctx.Request.Header.Peek(api.HeaderApplied)), 10, 64)
	return idx
}

// parseWait reads ?wait= as a Go duration ("30s") or seconds ("2.5").
func parseWait(v string, def time.Duration) (time.Duration, error) {
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		f, ferr := strconv.ParseFloat(v, 64)
		if ferr != nil || f != f {
			return 0, fmt.Errorf("wait %q: want a duration such as 30s", v)
		}
		d = time.Duration(f * float64(time.Second))
	}
	if d < 0 || d > maxGroupWait {
		return 0, fmt.Errorf("wait %v: want 0..%v", d, maxGroupWait)
	}
	return d, nil
}

// groupFail maps the groups package's errors to statuses.
func groupFail(ctx *fasthttp.RequestCtx, err error) {
	switch {
	case errors.Is(err, groups.ErrBadRequest):
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
	case errors.Is(err, groups.ErrDetached):
		writeError(ctx, fasthttp.StatusGone, err.Error())
	case errors.Is(err, groups.ErrNotStaged):
		writeError(ctx, fasthttp.StatusNotFound, err.Error())
	case errors.Is(err, groups.ErrFull):
		writeError(ctx, fasthttp.StatusServiceUnavailable, err.Error())
		ctx.Response.Header.Set("Retry-After", "1")
	case errors.Is(err, groups.ErrTooLarge):
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, err.Error())
	default:
		fail(ctx, err)
	}
}
