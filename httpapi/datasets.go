package httpapi

import (
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/control"
)

// datasetRoutes serve the catalog's datasets: list, register, describe,
// delete, and how far a registration has got.
type datasetRoutes struct {
	c       Datasets
	quota   splitRoutes   // a PUT with a quota
	derived derivedRoutes // a PUT with derived_from, and written counts (derived.go)
}

func (r datasetRoutes) list(ctx *fasthttp.RequestCtx, _ params) {
	if !catalogNotReady(ctx, r.c) {
		infos := r.c.Datasets()
		r.derived.countWritten(infos)
		writeJSON(ctx, 200, infos)
	}
}

func (r datasetRoutes) get(ctx *fasthttp.RequestCtx, p params) {
	if catalogNotReady(ctx, r.c) {
		return
	}
	if d, ok := findDataset(ctx, r.c, p.get("dataset"), true); ok {
		infos := []api.Dataset{control.DatasetInfo(d)}
		r.derived.countWritten(infos)
		writeJSON(ctx, 200, infos[0])
	}
}

func (r datasetRoutes) put(ctx *fasthttp.RequestCtx, p params) {
	var req api.PutDataset
	if err := decodeStrict(ctx.PostBody(), &req); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if req.Refresh {
		r.refresh(ctx, p.get("dataset"), req)
		return
	}
	if req.DerivedFrom != "" || req.Stage != "" {
		if req.Quota.Given {
			// Refused, not dropped: a quota the node ignored would look set.
			writeError(ctx, fasthttp.StatusBadRequest, "a derived dataset takes no quota: its items are evicted first "+
				"(they can be recomputed); set the quota on its parent "+req.DerivedFrom)
			return
		}
		r.derived.put(ctx, p.get("dataset"), req, r.c)
		return
	}
	if req.Quota.Given {
		r.quota.putQuota(ctx, p.get("dataset"), req)
		return
	}
	if req.Source == "" {
		writeError(ctx, fasthttp.StatusBadRequest, `body needs {"source": "dir:///abs/path"}`)
		return
	}
	rctx, cancel := reqContext(ctx, 10*time.Minute)
	defer cancel()
	d, created, err := r.c.PutDataset(rctx, p.get("dataset"), req.Source)
	if err != nil {
		fail(ctx, err)
		return
	}
	markApplied(ctx, r.c)
	writeCreated(ctx, created, d)
}

// refresh lists a registered dataset's source again as a new version:
// PUT /v1/datasets/{name} {"refresh": true} (docs/api.md). 201 with the new
// version, 200 with the registered one when the listing is unchanged.
func (r datasetRoutes) refresh(ctx *fasthttp.RequestCtx, name string, req api.PutDataset) {
	if req.Quota.Given || req.DerivedFrom != "" || req.Stage != "" {
		writeError(ctx, fasthttp.StatusBadRequest, `"refresh" goes alone (with "source" at most)`)
		return
	}
	rctx, cancel := reqContext(ctx, 10*time.Minute)
	defer cancel()
	d, changed, err := r.c.RefreshDataset(rctx, name, req.Source)
	if err != nil {
		fail(ctx, err)
		return
	}
	markApplied(ctx, r.c)
	writeCreated(ctx, changed, d)
}

func (r datasetRoutes) delete(ctx *fasthttp.RequestCtx, p params) {
	rctx, cancel := reqContext(ctx, 30*time.Second)
	defer cancel()
	if err := r.c.DeleteDataset(rctx, p.get("dataset")); err != nil {
		fail(ctx, err)
		return
	}
	markApplied(ctx, r.c)
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// registration answers how far a registration has got. The leader
// registers, so a follower relays the question to it.
func (r datasetRoutes) registration(ctx *fasthttp.RequestCtx, p params) {
	if relayUnknown(ctx, r.c) {
		return
	}
	name := p.get("dataset")
	reg, ok := r.c.Registration(name)
	if !ok {
		writeError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("no registration of %q on this node since it started", name))
		return
	}
	writeJSON(ctx, 200, reg)
}

// findDataset finds the dataset a request names; when this node does not
// know it, the request is answered and ok is false. Reads any member answers
// alike (relay) are answered by the leader then; node-local operations
// (warm-up) get 404 once the follower grace has passed.
func findDataset(ctx *fasthttp.RequestCtx, f Finder, name string, relay bool) (*catalog.Dataset, bool) {
	if relay && !f.HasDataset(name) && relayUnknown(ctx, f) {
		return nil, false
	}
	rctx, cancel := reqContext(ctx, time.Minute)
	defer cancel()
	d, err := f.Dataset(rctx, name)
	if err != nil {
		fail(ctx, err)
		return nil, false
	}
	return d, true
}

// warmupRoutes start a dataset's warm-up on this node and report on it.
type warmupRoutes struct {
	find Finder
	w    Warmups
}

func (r warmupRoutes) start(ctx *fasthttp.RequestCtx, p params) {
	d, ok := findDataset(ctx, r.find, p.get("dataset"), false)
	if !ok {
		return
	}
	if d.Derived() {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("%s is derived: loaders write its items, there is nothing to warm", d.Name))
		return
	}
	writeJSON(ctx, fasthttp.StatusAccepted, r.w.StartWarmup(d))
}

func (r warmupRoutes) progress(ctx *fasthttp.RequestCtx, p params) {
	if d, ok := findDataset(ctx, r.find, p.get("dataset"), false); ok {
		writeJSON(ctx, 200, r.w.WarmupProgress(d))
	}
}
