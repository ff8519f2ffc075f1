package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
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

// writeBatch answers [{"key": str, "data": bin}, ...]. The msgpack framing
// is built in one small buffer and the item bytes are not copied: they go to
// the socket from where they live (pinned until fasthttp closes the body)
// in one writev with the headers.
func (s *Server) writeBatch(ctx *fasthttp.RequestCtx, items []node.Item) {
	var meta bytes.Buffer
	enc := msgpack.NewEncoder(&meta)
	ends := make([]int, len(items)) // end of each item's framing in meta
	_ = enc.EncodeArrayLen(len(items))
	total := 0
	for j := range items {
		_ = enc.EncodeMapLen(2)
		_ = enc.EncodeString("key")
		_ = enc.EncodeString(items[j].Key)
		_ = enc.EncodeString("data")
		_ = enc.EncodeBytesLen(len(items[j].Data))
		ends[j] = meta.Len()
		total += len(items[j].Data)
		s.node.ServedBytes(len(items[j].Data))
	}
	m := meta.Bytes()
	bufs := make(net.Buffers, 0, 2*len(items))
	start := 0
	for j := range items {
		bufs = append(bufs, m[start:ends[j]], items[j].Data)
		start = ends[j]
	}
	if start < len(m) { // framing after the last item: all of it for an empty batch
		bufs = append(bufs, m[start:])
	}
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
