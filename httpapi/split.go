package httpapi

import (
	"context"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
)

// splitter is what the memory split's routes need of the node.
type splitter interface {
	PutQuota(ctx context.Context, name, source string, quota api.Quota) (api.Dataset, bool, error)
	SplitPlan(ctx context.Context) (api.Plan, error)
	ApplySplit(ctx context.Context, p api.Plan) error
}

// putQuota is PUT /v1/datasets/{name} with a quota (null lifts it): on an
// existing dataset the source may be left out, on a new one it registers it
// first.
func (s *Server) putQuota(ctx *fasthttp.RequestCtx, name string, req api.PutDataset) {
	var sp splitter = s.node
	rctx, cancel := reqContext(ctx, 10*time.Minute)
	defer cancel()
	d, created, err := sp.PutQuota(rctx, name, req.Source, req.Quota)
	if err != nil {
		fail(ctx, err)
		return
	}
	code := fasthttp.StatusOK
	if created {
		code = fasthttp.StatusCreated
	}
	s.markApplied(ctx)
	writeJSON(ctx, code, d)
}

// plan serves GET /v1/plan and POST /v1/plan/apply; seg are the path's
// segments after "plan".
func (s *Server) plan(ctx *fasthttp.RequestCtx, method string, seg []string) {
	var sp splitter = s.node
	rctx, cancel := reqContext(ctx, time.Minute)
	defer cancel()
	switch {
	case len(seg) == 0 && method == fasthttp.MethodGet:
		p, err := sp.SplitPlan(rctx)
		if err != nil {
			fail(ctx, err)
			return
		}
		writeJSON(ctx, 200, p)
	case len(seg) == 1 && seg[0] == "apply" && method == fasthttp.MethodPost:
		p, err := sp.SplitPlan(rctx)
		if err != nil {
			fail(ctx, err)
			return
		}
		if len(p.Split) == 0 {
			writeError(ctx, fasthttp.StatusConflict, "nothing to plan: no job has reported a complete epoch to this node")
			return
		}
		if err := sp.ApplySplit(rctx, p); err != nil {
			fail(ctx, err)
			return
		}
		p.Applied = true
		writeJSON(ctx, 200, p)
	case len(seg) == 0 || (len(seg) == 1 && seg[0] == "apply"):
		methodNotAllowed(ctx)
	default:
		writeError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("no such route /v1/plan/%s", seg[0]))
	}
}
