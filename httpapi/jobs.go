package httpapi

import (
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
)

func (s *Server) jobs(ctx *fasthttp.RequestCtx, method string, seg []string) {
	if len(seg) == 0 {
		if method != fasthttp.MethodGet {
			methodNotAllowed(ctx)
			return
		}
		writeJSON(ctx, 200, s.node.Jobs())
		return
	}
	name, err := decodeSegment("job", seg[0])
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	switch {
	case len(seg) == 2 && seg[1] == "positions" && method == fasthttp.MethodGet:
		writeJSON(ctx, 200, s.node.RankPositions(name))
		return
	case len(seg) == 4 && seg[1] == "ranks" && seg[3] == "position" && method == fasthttp.MethodPost:
		s.reportPosition(ctx, name, seg[2])
		return
	case len(seg) > 1:
		s.jobOrder(ctx, method, name, seg[1:])
		return
	}
	rctx, cancel := reqContext(ctx, 30*time.Second)
	defer cancel()
	switch method {
	case fasthttp.MethodGet:
		if !s.node.HasJob(name) && s.relayUnknown(ctx) {
			return
		}
		j, err := s.node.Job(rctx, name)
		if err != nil {
			fail(ctx, err)
			return
		}
		writeJSON(ctx, 200, j)
	case fasthttp.MethodPut:
		var j api.Job
		if err := decodeStrict(ctx.PostBody(), &j); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, err.Error())
			return
		}
		if j.Name != "" && j.Name != name {
			writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("body names job %q, path %q", j.Name, name))
			return
		}
		j.Name, j.Version = name, 0
		if err := validName("dataset", j.Dataset); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, err.Error())
			return
		}
		got, err := s.node.PutJob(rctx, j)
		if err != nil {
			fail(ctx, err)
			return
		}
		s.markApplied(ctx)
		writeJSON(ctx, 200, got)
	case fasthttp.MethodDelete:
		if err := s.node.DeleteJob(rctx, name); err != nil {
			fail(ctx, err)
			return
		}
		s.markApplied(ctx)
		ctx.SetStatusCode(fasthttp.StatusNoContent)
	default:
		methodNotAllowed(ctx)
	}
}

func (s *Server) loaderWait(ctx *fasthttp.RequestCtx) {
	var req api.LoaderWait
	if err := decodeStrict(ctx.PostBody(), &req); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if req.Seconds < 0 || req.Seconds > 1e6 || req.StepSeconds < 0 || req.StepSeconds > 1e6 {
		writeError(ctx, fasthttp.StatusBadRequest, "seconds or step_seconds out of range")
		return
	}
	s.node.ReportLoader(req)
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// reportPosition records a rank's position, as its sampler reports it at a
// checkpoint (shown by cachectl jobs ls).
func (s *Server) reportPosition(ctx *fasthttp.RequestCtx, job, rankSeg string) {
	rank, err := strconv.Atoi(rankSeg)
	var p api.RankPosition
	if err == nil {
		err = decodeStrict(ctx.PostBody(), &p)
	}
	if err != nil || rank < 0 || p.Position < 0 {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("rank %q and body {\"generation\",\"epoch\",\"position\"}: %v", rankSeg, err))
		return
	}
	p.Rank = rank
	if err := s.node.ReportPosition(job, p); err != nil {
		fail(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}
