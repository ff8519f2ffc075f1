package httpapi

import (
	"errors"
	"fmt"
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
	// Relayed reads wait as long as their ?wait=, longer than s.relayer's
	// timeout allows.
	s.groupRelay = &fasthttp.Client{Name: "stallfree-group-relay", ReadTimeout: maxGroupWait + 30*time.Second,
		MaxResponseBodySize: max(MaxBodySize, g.MaxBatchBytes())}
}

// bodyLimit is the largest request body a route takes: a group's batch as
// large as --max-item-bytes, everything else the server's limit.
func (s *Server) bodyLimit(seg []string) int {
	if n, ok := s.itemBodyLimit(seg); ok { // derived.go
		return n
	}
	if s.groups != nil && len(seg) >= 2 && seg[0] == "v1" && seg[1] == "groups" {
		return max(s.srv.MaxRequestBodySize, s.groups.MaxBatchBytes())
	}
	return s.srv.MaxRequestBodySize
}

// groupRoutes serves /v1/groups/...; seg are the path's segments after
// "groups".
func (s *Server) groupRoutes(ctx *fasthttp.RequestCtx, method string, seg []string) {
	if s.groups == nil {
		writeError(ctx, fasthttp.StatusNotFound, "no such route")
		return
	}
	if len(seg) == 0 {
		if method != fasthttp.MethodGet {
			methodNotAllowed(ctx)
			return
		}
		writeJSON(ctx, 200, s.groups.List())
		return
	}
	name, err := decodeSegment("group", seg[0])
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	rctx, cancel := reqContext(ctx, 30*time.Second)
	defer cancel()
	if len(seg) == 1 {
		switch method {
		case fasthttp.MethodGet:
			info, err := s.groups.Info(rctx, name, relayedIndex(ctx))
			if err != nil {
				groupFail(ctx, err)
				return
			}
			writeJSON(ctx, 200, info)
		case fasthttp.MethodPut:
			var spec api.GroupSpec
			if err := decodeStrict(ctx.PostBody(), &spec); err != nil {
				writeError(ctx, fasthttp.StatusBadRequest, err.Error())
				return
			}
			if err := validName("dataset", spec.Dataset); err != nil {
				writeError(ctx, fasthttp.StatusBadRequest, err.Error())
				return
			}
			info, created, err := s.groups.Put(rctx, name, spec)
			if err != nil {
				groupFail(ctx, err)
				return
			}
			s.markApplied(ctx)
			code := fasthttp.StatusOK
			if created {
				code = fasthttp.StatusCreated
			}
			writeJSON(ctx, code, info)
		case fasthttp.MethodDelete:
			if err := s.groups.Delete(rctx, name); err != nil {
				groupFail(ctx, err)
				return
			}
			s.markApplied(ctx)
			ctx.SetStatusCode(fasthttp.StatusNoContent)
		default:
			methodNotAllowed(ctx)
		}
		return
	}
	if len(seg) != 5 || seg[1] != "epochs" || seg[3] != "batches" {
		writeError(ctx, fasthttp.StatusNotFound, "no such route")
		return
	}
	s.groupBatch(ctx, method, name, seg[2], seg[4])
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
		code := fasthttp.StatusOK
		if created {
			code = fasthttp.StatusCreated
		}
		writeJSON(ctx, code, map[string]bool{"staged": created})
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
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	ctx.Request.CopyTo(req)
	req.SetRequestURI("http://" + addr + string(ctx.URI().RequestURI()))
	req.SetHost(addr)
	req.Header.Set(api.HeaderForwarded, s.node.Name())
	// What this node has applied: the owner waits for it before it says a
	// group defined through this node does not exist.
	req.Header.Set(api.HeaderApplied, strconv.FormatUint(s.node.AppliedIndex(), 10))
	if err := s.groupRelay.DoTimeout(req, resp, wait+30*time.Second); err != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, fmt.Sprintf("the group's owner at %s: %v", addr, err))
		return
	}
	resp.CopyTo(&ctx.Response)
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
