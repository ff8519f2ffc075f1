package httpapi

import (
	"fmt"

	"github.com/valyala/fasthttp"

	"stallfree/api"
)

// statusRoutes serve the probes and this node's figures.
type statusRoutes struct {
	n       Status
	loader  Loader
	relay   Relay
	metrics fasthttp.RequestHandler
	// checkpoints are the checkpoint service's figures (nil: none).
	checkpoints func() *api.CheckpointStats
}

func healthz(ctx *fasthttp.RequestCtx, _ params) {
	ctx.SetContentType("text/plain")
	ctx.SetBodyString("ok\n")
}

func (r statusRoutes) ready(ctx *fasthttp.RequestCtx, _ params) {
	if ok, why := r.n.Ready(); !ok {
		writeError(ctx, fasthttp.StatusServiceUnavailable, why)
		return
	}
	ctx.SetContentType("text/plain")
	ctx.SetBodyString("ready\n")
}

func (r statusRoutes) prometheus(ctx *fasthttp.RequestCtx, _ params) { r.metrics(ctx) }

func (r statusRoutes) stats(ctx *fasthttp.RequestCtx, _ params) {
	st := r.n.Stats()
	st.Checkpoints = r.checkpoints()
	writeJSON(ctx, 200, st)
}

func (r statusRoutes) cluster(ctx *fasthttp.RequestCtx, _ params) {
	writeJSON(ctx, 200, r.n.Cluster())
	markApplied(ctx, r.relay) // a joining node's catch-up target (control.CatalogReady)
}

func (r statusRoutes) loaderWait(ctx *fasthttp.RequestCtx, _ params) {
	var req api.LoaderWait
	if err := decodeStrict(ctx.PostBody(), &req); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if req.Seconds < 0 || req.Seconds > 1e6 || req.StepSeconds < 0 || req.StepSeconds > 1e6 {
		writeError(ctx, fasthttp.StatusBadRequest, "seconds or step_seconds out of range")
		return
	}
	// Names and ranks become keys of what the node keeps (split.Book) and
	// of the plan's answer: they keep to the rules for names in paths.
	if err := loaderNames(req); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	r.loader.ReportLoader(req)
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// maxReportedRank bounds a report's rank (a job's world size is bounded
// alike).
const maxReportedRank = api.MaxWorldSize

func loaderNames(r api.LoaderWait) error {
	if r.Job != "" {
		if err := validName("job", r.Job); err != nil {
			return err
		}
	}
	if r.Dataset != "" {
		if err := validName("dataset", r.Dataset); err != nil {
			return err
		}
	}
	if r.Rank < 0 || r.Rank >= maxReportedRank {
		return fmt.Errorf("rank %d: want 0..%d", r.Rank, maxReportedRank-1)
	}
	return nil
}
