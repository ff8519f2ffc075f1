package httpapi

import (
	"github.com/valyala/fasthttp"
)

// Gate is the catch-up gate catalog reads wait for (control.CatalogReady).
type Gate interface {
	CatalogReady() (ok bool, reason string)
}

// catalogNotReady answers a catalog read (GET /v1/datasets, /v1/datasets/{name},
// /v1/jobs, /v1/jobs/{job}) with 503, a JSON error and Retry-After while this
// node's catalog has not applied what the leader had when the node joined:
// a restarted node would otherwise list an empty or partial catalog. It
// reports whether ctx was answered. Items and batches are not held back: an
// unknown dataset is relayed to the leader (relayUnknown).
func catalogNotReady(ctx *fasthttp.RequestCtx, g Gate) bool {
	ok, why := g.CatalogReady()
	if ok {
		return false
	}
	writeError(ctx, fasthttp.StatusServiceUnavailable, "catalog not caught up yet: "+why)
	ctx.Response.Header.Set("Retry-After", "1") // writeError resets the response
	return true
}
