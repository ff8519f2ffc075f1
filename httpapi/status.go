package httpapi

import (
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
	r.loader.ReportLoader(req)
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}
