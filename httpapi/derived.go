package httpapi

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/derived"
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

// itemBodyLimit is the largest body of /v1/datasets/{name}/index/{i} (an
// item written to a derived dataset): up to --max-item-bytes, where every
// other dataset route keeps MaxBodySize. Bodies over the server's limit
// arrive as streams and are read against bodyLimit (readBody), so no other
// route reads more. ok is false for any other path.
func (s *Server) itemBodyLimit(seg []string) (limit int, ok bool) {
	if len(seg) == 5 && seg[0] == "v1" && seg[1] == "datasets" && seg[3] == "index" {
		return int(max(MaxBodySize, s.prep.MaxItemBytes())), true
	}
	return 0, false
}

// derivedRoutes serve the prep cache's writes (a derived dataset's
// registration, an item written at its owner) and add what has been written
// to the dataset routes' answers.
type derivedRoutes struct {
	prep    prep
	find    Finder
	self    string           // this node's name, on requests relayed to an owner
	relayer *fasthttp.Client // to the item's owner (not the leader: control's relay client is for that)
}

func newDerivedRoutes(p prep, find Finder, self string) derivedRoutes {
	return derivedRoutes{prep: p, find: find, self: self,
		relayer: &fasthttp.Client{Name: "stallfree-item-relay", ReadTimeout: time.Minute, MaxResponseBodySize: 1 << 20}}
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
	d, ok := findDataset(ctx, r.find, p.get("dataset"), true)
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
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	ctx.Request.CopyTo(req)
	req.SetRequestURI("http://" + addr + string(ctx.URI().PathOriginal()))
	req.SetHost(addr)
	req.Header.Set(api.HeaderForwarded, r.self)
	if err := r.relayer.DoTimeout(req, resp, 30*time.Second); err != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "relay to the item's owner: "+err.Error())
		ctx.Response.Header.Set("Retry-After", "1")
		return
	}
	resp.CopyTo(&ctx.Response)
}

// countWritten adds the cluster-wide written counts to dataset infos.
func (r derivedRoutes) countWritten(infos []api.Dataset) {
	rctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r.prep.Count(rctx, infos)
}
