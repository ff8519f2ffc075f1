package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/node"
	"stallfree/store"
)

// itemRoutes serve a dataset's items and samples: one by key or index, a
// batch, a tar dataset's samples, and the owner table clients route by.
type itemRoutes struct {
	find    Finder
	items   Items
	readers *sync.Pool // of *itemReader
}

func (r itemRoutes) byKey(ctx *fasthttp.RequestCtx, p params) {
	d, ok := findDataset(ctx, r.find, p.get("dataset"), true)
	if !ok {
		return
	}
	key, err := decodeKey(p.get("key"))
	if err != nil {
		fail(ctx, err)
		return
	}
	i, ok := d.Manifest.Index(key)
	if !ok {
		writeError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("dataset %s has no key %q", d.Name, key))
		return
	}
	r.serveItem(ctx, d, i)
}

func (r itemRoutes) byIndex(ctx *fasthttp.RequestCtx, p params) {
	d, ok := findDataset(ctx, r.find, p.get("dataset"), true)
	if !ok {
		return
	}
	raw := p.get("index")
	i, err := strconv.Atoi(raw)
	if err != nil || i < 0 || i >= d.Manifest.Len() {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("index %q: want an integer in [0,%d)", raw, d.Manifest.Len()))
		return
	}
	switch cache := string(ctx.QueryArgs().Peek("cache")); cache {
	case "":
		r.serveItem(ctx, d, i)
	case "bypass":
		r.serveUncached(ctx, d, i)
	default:
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("cache=%q: the only option is bypass", cache))
	}
}

func (r itemRoutes) owners(ctx *fasthttp.RequestCtx, p params) {
	d, ok := findDataset(ctx, r.find, p.get("dataset"), true)
	if !ok {
		return
	}
	b, err := msgpack.Marshal(r.items.Owners(d))
	if err != nil {
		fail(ctx, err)
		return
	}
	setRing(ctx, r.items.RingVersion())
	ctx.SetContentType("application/msgpack")
	ctx.SetBody(b)
}

func (r itemRoutes) batch(ctx *fasthttp.RequestCtx, p params) {
	d, ok := findDataset(ctx, r.find, p.get("dataset"), true)
	if !ok {
		return
	}
	var req api.BatchRequest
	if err := decodeStrict(ctx.PostBody(), &req); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if (req.Indices == nil) == (req.Keys == nil) {
		writeError(ctx, fasthttp.StatusBadRequest, `body needs exactly one of "indices" or "keys"`)
		return
	}
	idx := req.Indices
	if req.Keys != nil {
		idx = make([]int, len(req.Keys))
		for j, k := range req.Keys {
			i, ok := d.Manifest.Index(k)
			if !ok {
				writeError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("dataset %s has no key %q", d.Name, k))
				return
			}
			idx[j] = i
		}
	}
	if string(ctx.QueryArgs().Peek("map")) == "1" {
		r.locate(ctx, d, idx)
		return
	}
	// The node checks the count, the indices and the bytes (413, 400, 413).
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	get := r.items.GetManyFor
	if partial := string(ctx.QueryArgs().Peek("partial")); partial == "1" && d.Derived() {
		get = r.items.GetManyPartial // items not written yet answered nil
	} else if partial != "" {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("partial=%q: only partial=1, on a derived dataset", partial))
		return
	}
	items, err := get(rctx, d, idx, "")
	if err != nil {
		fail(ctx, err)
		return
	}
	writeBatch(ctx, r.items, items)
}

// locate answers POST batch?map=1 from a loader on this host: where each
// item lies in the node's shared arena (node.LocateMany), for the loader to
// copy it from there, as msgpack {"arena": path, "gens": path, "size": n,
// "page": bytes a generation covers, "items": [[off, size, gens, key] or
// nil]}; nil marks an item not resident here, which the loader reads
// through a plain batch request. Over TCP, or where the arena is not
// shared, there is nothing to map: 204.
func (r itemRoutes) locate(ctx *fasthttp.RequestCtx, d *catalog.Dataset, idx []int) {
	if err := node.CheckIndices(d, idx); err != nil {
		fail(ctx, err)
		return
	}
	if !overUnixSocket(ctx) {
		ctx.SetStatusCode(fasthttp.StatusNoContent)
		return
	}
	loc, ok, err := r.items.LocateMany(d, idx, "")
	if err != nil {
		fail(ctx, err)
		return
	}
	if !ok {
		ctx.SetStatusCode(fasthttp.StatusNoContent)
		return
	}
	items := make([]any, len(loc.Items))
	for j, it := range loc.Items {
		if it.Found {
			items[j] = []any{it.Off, it.Size, it.Gens, it.Key}
		}
	}
	b, err := msgpack.Marshal(map[string]any{"arena": loc.Arena, "gens": loc.Gens, "size": loc.Size,
		"page": store.GenPage, "items": items})
	if err != nil {
		fail(ctx, err)
		return
	}
	ctx.SetContentType("application/msgpack")
	ctx.SetBody(b)
}

// samples serves POST samples/batch {"indices": [...]} of a tar dataset: an
// array of sample maps in request order.
func (r itemRoutes) samples(ctx *fasthttp.RequestCtx, p params) {
	d, ok := findDataset(ctx, r.find, p.get("dataset"), true)
	if !ok {
		return
	}
	var req api.BatchRequest
	if err := decodeStrict(ctx.PostBody(), &req); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if req.Indices == nil || req.Keys != nil {
		writeError(ctx, fasthttp.StatusBadRequest, `body needs {"indices": [...]} (samples are asked for by index)`)
		return
	}
	r.serveSamples(ctx, d, req.Indices, false)
}

// sample serves GET samples/{i} of a tar dataset: one sample map.
func (r itemRoutes) sample(ctx *fasthttp.RequestCtx, p params) {
	d, ok := findDataset(ctx, r.find, p.get("dataset"), true)
	if !ok {
		return
	}
	raw := p.get("sample")
	i, err := strconv.Atoi(raw)
	if err != nil || i < 0 {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("sample %q: want a non-negative integer", raw))
		return
	}
	r.serveSamples(ctx, d, []int{i}, true)
}

func (r itemRoutes) serveSamples(ctx *fasthttp.RequestCtx, d *catalog.Dataset, idx []int, one bool) {
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	items, spans, err := r.items.GetSamplesFor(rctx, d, idx, "")
	if err != nil {
		fail(ctx, err)
		return
	}
	writeSamples(ctx, r.items, items, spans, one)
}

// writeBatch answers [{"key": str, "data": bin}, ...]. The msgpack framing
// is built in one small buffer and the item bytes are not copied: they go to
// the socket from where they live (pinned until fasthttp closes the body)
// in one writev with the headers.
func writeBatch(ctx *fasthttp.RequestCtx, to Served, items []node.Item) {
	var meta bytes.Buffer
	enc := msgpack.NewEncoder(&meta)
	ends := make([]int, len(items)) // end of each item's framing in meta
	_ = enc.EncodeArrayLen(len(items))
	for j := range items {
		if items[j].NotWritten {
			_ = enc.EncodeNil()
			ends[j] = meta.Len()
			continue
		}
		_ = enc.EncodeMapLen(2)
		_ = enc.EncodeString("key")
		_ = enc.EncodeString(items[j].Key)
		_ = enc.EncodeString("data")
		_ = enc.EncodeBytesLen(len(items[j].Data))
		ends[j] = meta.Len()
	}
	writeFramed(ctx, to, items, meta.Bytes(), ends)
}

// writeSamples answers WebDataset sample maps, {"__key__": str, EXT: bin,
// ...}: one map (one) or an array of them, framed like writeBatch.
func writeSamples(ctx *fasthttp.RequestCtx, to Served, items []node.Item, spans []node.SampleSpan, one bool) {
	var meta bytes.Buffer
	enc := msgpack.NewEncoder(&meta)
	ends := make([]int, len(items))
	if !one {
		_ = enc.EncodeArrayLen(len(spans))
	}
	j := 0
	for _, sp := range spans {
		_ = enc.EncodeMapLen(1 + sp.End - j)
		_ = enc.EncodeString("__key__")
		_ = enc.EncodeString(sp.Key)
		for ; j < sp.End; j++ {
			_ = enc.EncodeString(catalog.ExtOf(items[j].Key, sp.Key))
			_ = enc.EncodeBytesLen(len(items[j].Data))
			ends[j] = meta.Len()
		}
	}
	writeFramed(ctx, to, items, meta.Bytes(), ends)
}

// writeFramed sends msgpack framing m with each item's bytes spliced in
// after ends[j], the end of its framing.
func writeFramed(ctx *fasthttp.RequestCtx, to Served, items []node.Item, m []byte, ends []int) {
	total := 0
	for j := range items {
		total += len(items[j].Data)
		to.ServedBytes(len(items[j].Data))
	}
	bufs := make(net.Buffers, 0, 2*len(items))
	start := 0
	for j := range items {
		bufs = append(bufs, m[start:ends[j]], items[j].Data)
		start = ends[j]
	}
	if start < len(m) { // framing after the last item: all of it for an empty batch
		bufs = append(bufs, m[start:])
	}
	setRing(ctx, to.RingVersion())
	br := &batchReader{bufs: bufs, items: items}
	br.conn, _ = ctx.Conn().(*gatherConn)
	ctx.SetContentType("application/msgpack")
	ctx.SetBodyStream(br, total+len(m))
}

// batchReader streams a batch response and unpins its items on Close.
type batchReader struct {
	bufs  net.Buffers
	items []node.Item
	conn  *gatherConn
}

func (b *batchReader) Read(p []byte) (int, error) { return b.bufs.Read(p) }

func (b *batchReader) WriteTo(w io.Writer) (int64, error) {
	if bw, ok := w.(*bufio.Writer); ok && b.conn != nil {
		return b.conn.writeBuffersAfter(bw, b.bufs...)
	}
	return b.bufs.WriteTo(w)
}

func (b *batchReader) Close() error {
	for j := range b.items {
		b.items[j].Release()
	}
	b.items = nil
	return nil
}

// setRing sets X-Ring, the ring version owner-routing clients compare with
// their owner table's, without allocating.
func setRing(ctx *fasthttp.RequestCtx, v uint64) {
	var b [16]byte
	ctx.Response.Header.SetBytesV("X-Ring", strconv.AppendUint(b[:0], v, 16))
}

// serveUncached reads an item from storage without touching the cache
// (?cache=bypass): cachectl analyze measures the cold ingestion rate with it
// without evicting or filling anything.
func (r itemRoutes) serveUncached(ctx *fasthttp.RequestCtx, d *catalog.Dataset, i int) {
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	it, err := r.items.ReadUncached(rctx, d, i)
	if err != nil {
		fail(ctx, err)
		return
	}
	r.streamItem(ctx, it)
}

func (r itemRoutes) serveItem(ctx *fasthttp.RequestCtx, d *catalog.Dataset, i int) {
	// No deadline here: a hit needs none, and fills bound themselves.
	it, err := r.items.Get(context.Background(), d, i)
	if err != nil {
		fail(ctx, err)
		return
	}
	setRing(ctx, r.items.RingVersion())
	r.streamItem(ctx, it)
}

// streamItem answers one item; it is released (its pin, its buffer, its
// in-flight charge) once the last byte is written.
func (r itemRoutes) streamItem(ctx *fasthttp.RequestCtx, it node.Item) {
	h := &ctx.Response.Header
	h.Set("X-Cache", string(it.Cache))
	h.Set("X-Key", it.Key)
	var etag [18]byte // built on the stack: a hit allocates nothing
	h.SetBytesV("ETag", append(strconv.AppendUint(append(etag[:0], '"'), it.Sum, 16), '"'))
	ctx.SetContentType("application/octet-stream")
	r.items.ServedBytes(len(it.Data))
	ir := r.readers.Get().(*itemReader)
	ir.item, ir.pool = it, r.readers
	ir.conn, _ = ctx.Conn().(*gatherConn)
	ctx.SetBodyStream(ir, len(it.Data))
}
