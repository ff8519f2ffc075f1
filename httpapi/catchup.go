package httpapi

import (
	"github.com/valyala/fasthttp"
)

// catalogNotReady answers a catalog read (GET /v1/datasets, /v1/datasets/{name},
// /v1/jobs, /v1/jobs/{job}) with 503, a JSON error and Retry-After while this
// node's catalog has not applied what the leader had when the node joined:
// a restarted node would otherwise list an empty or partial catalog. It
// reports whether ctx was answered. Items and batches are not held back: an
// unknown dataset is relayed to the leader (relayUnknown).
func (s *Server) catalogNotReady(ctx *fasthttp.RequestCtx, method string, seg []string) bool {
	if method != fasthttp.MethodGet || len(seg) < 2 || len(seg) > 3 || (seg[1] != "datasets" && seg[1] != "jobs") {
		return false
	}
	ok, why := s.node.CatalogReady()
	if ok {
		return false
	}
	writeError(ctx, fasthttp.StatusServiceUnavailable, "catalog not caught up yet: "+why)
	ctx.Response.Header.Set("Retry-After", "1") // writeError resets the response
	return true
}
