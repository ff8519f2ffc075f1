package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/node"
)

func (s *Server) batch(ctx *fasthttp.RequestCtx, d *catalog.Dataset) {
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
	// The node checks the count, the indices and the bytes (413, 400, 413).
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	items, err := s.node.GetMany(rctx, d, idx)
	if err != nil {
		fail(ctx, err)
		return
	}
	s.writeBatch(ctx, items)
}

// samples serves GET samples/{i} (one map) and POST samples/batch
// {"indices": [...]} (an array of maps in request order) of a tar dataset.
func (s *Server) samples(ctx *fasthttp.RequestCtx, method string, d *catalog.Dataset, seg []string) {
	var idx []int
	one := false
	switch {
	case len(seg) == 1 && seg[0] == "batch" && method == fasthttp.MethodPost:
		var req api.BatchRequest
		if err := decodeStrict(ctx.PostBody(), &req); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, err.Error())
			return
		}
		if req.Indices == nil || req.Keys != nil {
			writeError(ctx, fasthttp.StatusBadRequest, `body needs {"indices": [...]} (samples are asked for by index)`)
			return
		}
		idx = req.Indices
	case len(seg) == 1 && method == fasthttp.MethodGet:
		i, err := strconv.Atoi(seg[0])
		if err != nil || i < 0 {
			writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("sample %q: want a non-negative integer", seg[0]))
			return
		}
		idx, one = []int{i}, true
	default:
		writeError(ctx, fasthttp.StatusNotFound, "no such route")
		return
	}
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	items, spans, err := s.node.GetSamplesFor(rctx, d, idx, "")
	if err != nil {
		fail(ctx, err)
		return
	}
	s.writeSamples(ctx, items, spans, one)
}

// writeBatch answers [{"key": str, "data": bin}, ...]. The msgpack framing
// is built in one small buffer and the item bytes are not copied: they go to
// the socket from where they live (pinned until fasthttp closes the body)
// in one writev with the headers.
func (s *Server) writeBatch(ctx *fasthttp.RequestCtx, items []node.Item) {
	var meta bytes.Buffer
	enc := msgpack.NewEncoder(&meta)
	ends := make([]int, len(items)) // end of each item's framing in meta
	_ = enc.EncodeArrayLen(len(items))
	for j := range items {
		_ = enc.EncodeMapLen(2)
		_ = enc.EncodeString("key")
		_ = enc.EncodeString(items[j].Key)
		_ = enc.EncodeString("data")
		_ = enc.EncodeBytesLen(len(items[j].Data))
		ends[j] = meta.Len()
	}
	s.writeFramed(ctx, items, meta.Bytes(), ends)
}

// writeSamples answers WebDataset sample maps, {"__key__": str, EXT: bin,
// ...}: one map (one) or an array of them, framed like writeBatch.
func (s *Server) writeSamples(ctx *fasthttp.RequestCtx, items []node.Item, spans []node.SampleSpan, one bool) {
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
	s.writeFramed(ctx, items, meta.Bytes(), ends)
}

// writeFramed sends msgpack framing m with each item's bytes spliced in
// after ends[j], the end of its framing.
func (s *Server) writeFramed(ctx *fasthttp.RequestCtx, items []node.Item, m []byte, ends []int) {
	total := 0
	for j := range items {
		total += len(items[j].Data)
		s.node.ServedBytes(len(items[j].Data))
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
	setRing(ctx, s.node.RingVersion())
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
