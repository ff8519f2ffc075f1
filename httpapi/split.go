package httpapi

import (
	"context"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
)

// Splitter is what the memory split's routes need of the node.
type Splitter interface {
	PutQuota(ctx context.Context, name, source string, quota api.Quota) (api.Dataset, bool, error)
	SplitPlan(ctx context.Context) (api.Plan, error)
	ApplySplit(ctx context.Context, p api.Plan) error
}

// splitRoutes serve quotas and the memory split: GET /v1/plan, POST
// /v1/plan/apply, and PUT /v1/datasets/{name} with a quota (datasetRoutes
// hands that one over).
type splitRoutes struct {
	sp    Splitter
	relay Relay
}

// putQuota is PUT /v1/datasets/{name} with a quota (null lifts it): on an
// existing dataset the source may be left out, on a new one it registers it
// first.
func (r splitRoutes) putQuota(ctx *fasthttp.RequestCtx, name string, req api.PutDataset) {
	rctx, cancel := reqContext(ctx, 10*time.Minute)
	defer cancel()
	d, created, err := r.sp.PutQuota(rctx, name, req.Source, req.Quota)
	if err != nil {
		fail(ctx, err)
		return
	}
	markApplied(ctx, r.relay)
	writeCreated(ctx, created, d)
}

func (r splitRoutes) plan(ctx *fasthttp.RequestCtx, _ params) {
	rctx, cancel := reqContext(ctx, time.Minute)
	defer cancel()
	p, err := r.sp.SplitPlan(rctx)
	if err != nil {
		fail(ctx, err)
		return
	}
	writeJSON(ctx, 200, p)
}

func (r splitRoutes) apply(ctx *fasthttp.RequestCtx, _ params) {
	rctx, cancel := reqContext(ctx, time.Minute)
	defer cancel()
	p, err := r.sp.SplitPlan(rctx)
	if err != nil {
		fail(ctx, err)
		return
	}
	if len(p.Split) == 0 {
		writeError(ctx, fasthttp.StatusConflict, "nothing to plan: no job has reported a complete epoch to this node")
		return
	}
	if err := r.sp.ApplySplit(rctx, p); err != nil {
		fail(ctx, err)
		return
	}
	p.Applied = true
	writeJSON(ctx, 200, p)
}
