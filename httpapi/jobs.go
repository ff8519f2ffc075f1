package httpapi

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/split"
)

// jobRoutes serve the registered jobs and the positions their ranks report.
type jobRoutes struct {
	c Jobs
	// stall is the per-rank stall figures: the job's, gathered from every
	// member, and this node's part of them (the internal stall route).
	stall Stall
}

// Stall is what the job routes use of the per-rank stall figures.
type Stall interface {
	JobStall(ctx context.Context, job string) []api.RankStall
	StallWindows(job string) []split.RankWindow
	ActiveStallWindows() map[string][]split.RankWindow
}

// localActiveStall is the internal route a scrape of /metrics asks each
// member once: this node's windows of every job that reported lately.
func (r jobRoutes) localActiveStall(ctx *fasthttp.RequestCtx, _ params) {
	writeJSON(ctx, 200, r.stall.ActiveStallWindows())
}

// localStall is the internal route: this node's windows of a job's ranks.
func (r jobRoutes) localStall(ctx *fasthttp.RequestCtx, p params) {
	w := r.stall.StallWindows(p.get("job"))
	if w == nil {
		w = []split.RankWindow{}
	}
	writeJSON(ctx, 200, w)
}

func (r jobRoutes) list(ctx *fasthttp.RequestCtx, _ params) {
	if !catalogNotReady(ctx, r.c) {
		writeJSON(ctx, 200, r.c.Jobs())
	}
}

func (r jobRoutes) get(ctx *fasthttp.RequestCtx, p params) {
	if catalogNotReady(ctx, r.c) {
		return
	}
	name := p.get("job")
	if !r.c.HasJob(name) && relayUnknown(ctx, r.c) {
		return
	}
	rctx, cancel := reqContext(ctx, 30*time.Second)
	defer cancel()
	j, err := r.c.Job(rctx, name)
	if err != nil {
		fail(ctx, err)
		return
	}
	writeJSON(ctx, 200, api.JobInfo{Job: j, Stall: r.stall.JobStall(rctx, name)})
}

func (r jobRoutes) put(ctx *fasthttp.RequestCtx, p params) {
	name := p.get("job")
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
	rctx, cancel := reqContext(ctx, 30*time.Second)
	defer cancel()
	got, err := r.c.PutJob(rctx, j)
	if err != nil {
		fail(ctx, err)
		return
	}
	markApplied(ctx, r.c)
	writeJSON(ctx, 200, got)
}

func (r jobRoutes) delete(ctx *fasthttp.RequestCtx, p params) {
	rctx, cancel := reqContext(ctx, 30*time.Second)
	defer cancel()
	if err := r.c.DeleteJob(rctx, p.get("job")); err != nil {
		fail(ctx, err)
		return
	}
	markApplied(ctx, r.c)
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

func (r jobRoutes) positions(ctx *fasthttp.RequestCtx, p params) {
	writeJSON(ctx, 200, r.c.RankPositions(p.get("job")))
}

// reportPosition records a rank's position, as its sampler reports it at a
// checkpoint (shown by cachectl jobs ls).
func (r jobRoutes) reportPosition(ctx *fasthttp.RequestCtx, p params) {
	rankSeg := p.get("rank")
	rank, err := strconv.Atoi(rankSeg)
	var pos api.RankPosition
	if err == nil {
		err = decodeStrict(ctx.PostBody(), &pos)
	}
	if err != nil || rank < 0 || pos.Position < 0 {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("rank %q and body {\"generation\",\"epoch\",\"position\"}: %v", rankSeg, err))
		return
	}
	pos.Rank = rank
	if err := r.c.ReportPosition(p.get("job"), pos); err != nil {
		fail(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}
