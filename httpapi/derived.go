package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/derived"
	"stallfree/relay"
)

// The prep cache's routes (derived datasets, docs/api.md "Prep cache"): the
// handlers hold only the derived.Prep.

// prep is what these handlers use of the node.
type prep interface {
	Derive(ctx context.Context, name, parent, stage string) (api.Dataset, bool, error)
	Route(d *catalog.Dataset, index int) (addr string, self, ok bool)
	Check(d *catalog.Dataset, index int, size int) error
	Write(d *catalog.Dataset, index int, data []byte) (bool, error)
	Count(ctx context.Context, infos []api.Dataset)
	MaxItemBytes() int64
}

var _ prep = (*derived.Prep)(nil)

// derivedStatus maps the prep cache's errors to status codes; ok is false
// for any other error.
func derivedStatus(err error) (int, bool) {
	switch {
	case errors.Is(err, derived.ErrNotWritten), errors.Is(err, derived.ErrOutOfRange):
		return fasthttp.StatusNotFound, true
	case errors.Is(err, derived.ErrNotDerived), errors.Is(err, derived.ErrInvalid):
		return fasthttp.StatusBadRequest, true
	case errors.Is(err, derived.ErrTooLarge):
		return fasthttp.StatusRequestEntityTooLarge, true
	case errors.Is(err, derived.ErrFull):
		return fasthttp.StatusInsufficientStorage, true
	}
	return 0, false
}

// itemBodyLimit is the largest body of PUT /v1/datasets/{name}/index/{i}
// (an item written to a derived dataset): up to --max-item-bytes, where
// every other dataset route keeps MaxBodySize.
func (s *Server) itemBodyLimit() int { return int(max(MaxBodySize, s.prep.MaxItemBytes())) }

// derivedRoutes serve the prep cache's writes (a derived dataset's
// registration, an item written at its owner) and add what has been written
// to the dataset routes' answers.
type derivedRoutes struct {
	prep  prep
	find  Finder
	peers *relay.Client // the node's client to the other nodes: an item is written at its owner
}

// put serves PUT /v1/datasets/{name} {"derived_from", "stage"} (from
// datasetRoutes.put, which sees the body first).
func (r derivedRoutes) put(ctx *fasthttp.RequestCtx, name string, req api.PutDataset, relay Relay) {
	if req.Source != "" {
		writeError(ctx, fasthttp.StatusBadRequest, `a dataset has either "source" or "derived_from", not both`)
		return
	}
	rctx, cancel := reqContext(ctx, time.Minute)
	defer cancel()
	info, created, err := r.prep.Derive(rctx, name, req.DerivedFrom, req.Stage)
	if err != nil {
		fail(ctx, err)
		return
	}
	infos := []api.Dataset{info}
	r.prep.Count(rctx, infos)
	info = infos[0]
	markApplied(ctx, relay)
	writeCreated(ctx, created, info)
}

// putItem serves PUT /v1/datasets/{name}/index/{i}: the write goes to the
// item's owner. A node that does not own it relays the request over HTTP
// to the owner's API, as it came (status and body come back unchanged); the
// owner stores it even if its own ring disagrees, so a request is never
// relayed twice.
func (r derivedRoutes) putItem(ctx *fasthttp.RequestCtx, p params) {
	// Not relayed to the leader when this node has not learnt the dataset
	// yet (a follower moments after the derived dataset was made): the
	// leader would take the write as relayed and keep the item whether it
	// owns it or not. The catalog catches up instead (control.Dataset).
	d, ok := findDataset(ctx, r.find, p.get("dataset"), false)
	if !ok {
		return
	}
	seg := p.get("index")
	i, err := strconv.Atoi(seg)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("index %q: want an integer", seg))
		return
	}
	body := ctx.PostBody()
	if err := r.prep.Check(d, i, len(body)); err != nil {
		fail(ctx, err)
		return
	}
	if addr, self, ok := r.prep.Route(d, i); !self && !relayed(ctx) {
		if !ok {
			writeError(ctx, fasthttp.StatusServiceUnavailable, "the item's owner is not reachable; retry")
			ctx.Response.Header.Set("Retry-After", "1")
			return
		}
		// The body's buffer is recycled once this handler returns, and
		// net/http may still be reading a relayed body then (an owner that
		// answers before reading it all): the relay sends a copy of its own.
		ctx.Request.SetBodyRaw(bytes.Clone(body))
		r.relayTo(ctx, addr)
		return
	}
	created, err := r.prep.Write(d, i, body)
	if err != nil {
		fail(ctx, err)
		return
	}
	writeCreated(ctx, created, map[string]any{"index": i, "bytes": len(body), "created": created})
}

// relayTo sends the request as it came to the node at addr and answers with
// its response; no answer is a 503.
func (r derivedRoutes) relayTo(ctx *fasthttp.RequestCtx, addr string) {
	rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.peers.Forward(rctx, addr, string(ctx.URI().PathOriginal()), &ctx.Request, &ctx.Response, nil, 1<<20); err != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "relay to the item's owner: "+err.Error())
		ctx.Response.Header.Set("Retry-After", "1")
	}
}

// countWritten adds the cluster-wide written counts to dataset infos.
func (r derivedRoutes) countWritten(infos []api.Dataset) {
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.prep.Count(rctx, infos)
}
