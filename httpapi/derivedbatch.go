package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/node"
)

// MaxWriteBatchBytes bounds the body of PUT /v1/datasets/{name}/batch: a
// minibatch of prep-cache items (256 of 224×224×3 bytes is 37 MiB).
const MaxWriteBatchBytes = 256 << 20

// writeBatchBodyLimit is that route's body limit: a batch holds at least
// one item of up to --max-item-bytes.
func (s *Server) writeBatchBodyLimit() int {
	return int(max(MaxWriteBatchBytes, s.prep.MaxItemBytes()+1<<20))
}

// putBatch serves PUT /v1/datasets/{name}/batch: several items of a derived
// dataset written in one request, as PUT …/index/{i} writes one (the prep
// cache's first epoch writes a minibatch's worth at once, not a request per
// item). The body is a msgpack array of {"index", "data"}; the answer is
// 200 with one api.WriteResult per item, in order. Every item is checked
// first: a malformed body, an index out of range, an item over
// --max-item-bytes or a dataset that is not derived fails the whole
// request, and nothing is written. Then each item is written at its owner:
// this node's directly, another node's in one relayed request per owner. A
// relayed request is written here whatever this node's ring says, so no
// request is relayed twice.
func (r derivedRoutes) putBatch(ctx *fasthttp.RequestCtx, p params) {
	// Not relayed to the leader when this node has not learnt the dataset
	// yet: the leader would take the request as relayed and write every
	// item itself, owner or not. The catalog catches up instead.
	d, ok := findDataset(ctx, r.find, p.get("dataset"), false)
	if !ok {
		return
	}
	// At most node.MaxBatch items, as for batch reads: each item costs a
	// result, and the answer grows with them.
	items, err := decodeItemWrites(ctx.PostBody(), node.MaxBatch)
	var tooMany errTooManyItems
	switch {
	case errors.As(err, &tooMany):
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, err.Error())
		return
	case err != nil:
		writeError(ctx, fasthttp.StatusBadRequest, "malformed msgpack body: want an array of {index, data}: "+err.Error())
		return
	case len(items) == 0:
		writeError(ctx, fasthttp.StatusBadRequest, "an empty batch: want an array of {index, data}")
		return
	}
	for _, it := range items {
		if err := r.prep.Check(d, it.Index, len(it.Data)); err != nil {
			fail(ctx, err)
			return
		}
	}
	results := make([]api.WriteResult, len(items))
	byOwner := map[string][]int{} // owner's HTTP address → positions in items
	for j, it := range items {
		results[j] = api.WriteResult{Index: it.Index, Bytes: len(it.Data)}
		addr, self, ok := r.prep.Route(d, it.Index)
		switch {
		case self || relayed(ctx):
			r.writeOne(d, it, &results[j])
		case !ok:
			results[j].Status, results[j].Error = fasthttp.StatusServiceUnavailable, "the item's owner is not reachable; retry"
		default:
			byOwner[addr] = append(byOwner[addr], j)
		}
	}
	// The owners at once, each with its own deadline: a slow one delays the
	// answer, not the others' writes. Each fills in its own positions.
	// The client's credentials go along; its header is copied here, not in
	// the goroutines: fasthttp's request is no concurrent reader.
	path := string(ctx.URI().PathOriginal())
	var wg sync.WaitGroup
	for addr, at := range byOwner {
		req := fasthttp.AcquireRequest()
		ctx.Request.Header.CopyTo(&req.Header)
		wg.Go(func() {
			defer fasthttp.ReleaseRequest(req)
			r.relayBatch(req, addr, path, items, at, results)
		})
	}
	wg.Wait()
	writeJSON(ctx, fasthttp.StatusOK, results)
}

// writeOne writes one item here and records its outcome.
func (r derivedRoutes) writeOne(d *catalog.Dataset, it api.ItemWrite, res *api.WriteResult) {
	created, err := r.prep.Write(d, it.Index, it.Data)
	if err != nil {
		res.Status, res.Error, _ = status(err)
		return
	}
	res.Status, res.Created = fasthttp.StatusOK, created
	if created {
		res.Status = fasthttp.StatusCreated
	}
}

// relayBatch writes the items at positions in one request (req, the
// client's header) to the node at addr, their owner, and fills in their
// results; when no whole answer comes,
// each is a 503. An owner that answers 405 (one from before batch writes,
// during a rolling upgrade) gets them one by one.
func (r derivedRoutes) relayBatch(req *fasthttp.Request, addr, path string, items []api.ItemWrite, positions []int, results []api.WriteResult) {
	rctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	unreachable := func(at []int, why string) {
		for _, j := range at {
			results[j].Status, results[j].Error = fasthttp.StatusServiceUnavailable, "relay to the item's owner: "+why
		}
	}
	part := make([]api.ItemWrite, len(positions))
	for x, j := range positions {
		part[x] = items[j]
	}
	body, err := msgpack.Marshal(part)
	if err != nil {
		unreachable(positions, err.Error())
		return
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	// Raw: net/http may still read a relayed body after Forward returns
	// (an owner that answers before reading it all), and a body of
	// fasthttp's pool goes back to it with req; Marshal's is the
	// collector's.
	req.SetBodyRaw(body)
	if err := r.peers.Forward(rctx, addr, path, req, resp, nil, 1<<20); err != nil {
		unreachable(positions, err.Error())
		return
	}
	if resp.StatusCode() == fasthttp.StatusMethodNotAllowed {
		r.relayEach(rctx, req, resp, addr, strings.TrimSuffix(path, "batch")+"index/", items, positions, results)
		return
	}
	var got []api.WriteResult
	if resp.StatusCode() != fasthttp.StatusOK {
		unreachable(positions, fmt.Sprintf("answered %d: %s", resp.StatusCode(), bytes.TrimSpace(resp.Body())))
		return
	}
	if err := json.Unmarshal(resp.Body(), &got); err != nil || len(got) != len(positions) {
		unreachable(positions, fmt.Sprintf("%d results for %d items (%v)", len(got), len(positions), err))
		return
	}
	for x, j := range positions {
		results[j] = got[x]
	}
}

// relayEach writes the items at positions one request each (PUT
// {prefix}{index}) to the node at addr, reusing req and resp.
func (r derivedRoutes) relayEach(rctx context.Context, req *fasthttp.Request, resp *fasthttp.Response, addr, prefix string, items []api.ItemWrite, positions []int, results []api.WriteResult) {
	for _, j := range positions {
		res := &results[j]
		req.SetBodyRaw(bytes.Clone(items[j].Data)) // a slice of the recycled request body: relayed as a copy of its own (relayBatch)
		req.Header.SetContentType("application/octet-stream")
		resp.Reset()
		if err := r.peers.Forward(rctx, addr, prefix+strconv.Itoa(items[j].Index), req, resp, nil, 1<<16); err != nil {
			res.Status, res.Error = fasthttp.StatusServiceUnavailable, "relay to the item's owner: "+err.Error()
			continue
		}
		res.Status = resp.StatusCode()
		res.Created = res.Status == fasthttp.StatusCreated
		if res.Status >= 300 {
			var e api.Error
			if json.Unmarshal(resp.Body(), &e) != nil || e.Message == "" {
				e.Message = string(bytes.TrimSpace(resp.Body()))
			}
			res.Error = e.Message
		}
	}
}
