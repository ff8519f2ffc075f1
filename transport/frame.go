// Package transport is the node-to-node protocol: length-prefixed frames over
// TCP, each a small msgpack header followed by raw item bytes that msgpack
// never decodes. Connections are mutually authenticated from the cluster key,
// multiplexed by request id, pooled per peer, and bounded in every dimension
// before anything is allocated.
package transport

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/vmihailenco/msgpack/v5"

	"stallfree/bufpool"
)

// Limits, checked before allocating.
const (
	MaxHeader  = 64 << 10  // header bytes per frame
	MaxPayload = 640 << 20 // item bytes per frame (a batch response)
	MaxItems   = 4096      // indices per request
	// MaxPush bounds the item bytes a push request carries: a warm-up hands
	// its samples over in frames of a few MiB.
	MaxPush   = 64 << 20
	prefixLen = 4 + 8 // u32 header length, u64 payload length
)

// Op is a request type.
type Op uint8

// Ops.
const (
	OpGet  Op = 1 // fetch items by manifest index
	OpPush Op = 2 // hand items to their owner (a tar shard's warm-up)
	// OpStats asks a member for its cache figures (Figures), which the
	// cluster view shows: a header without indices, answered with the
	// figures msgpack-encoded as the payload.
	OpStats Op = 3
)

// Figures are a member's cache figures, as other members read them for the
// cluster view: a typed message, so no member parses another's Prometheus
// text.
type Figures struct {
	Items int    `msgpack:"items"`
	Bytes uint64 `msgpack:"bytes"`
}

// maxFigures bounds an encoded Figures answer.
const maxFigures = 4 << 10

// Status of a response.
type Status uint8

// Statuses.
const (
	StatusOK    Status = 0
	StatusError Status = 1
)

// Flags on a request.
const (
	// FlagHandoff asks the previous owner for items it holds in memory and
	// nothing else: it must not read storage for them, and releases them once
	// sent, since the asker now owns them.
	FlagHandoff uint8 = 1
)

// Header is the msgpack part of a frame. Requests fill Op, Dataset,
// DatasetVersion, Indices, Ring and Flags (a push also Sizes and Sums of the
// items it carries); responses fill Status, Err, Sizes (-1 = not held, or for
// a push not kept) and Sums.
type Header struct {
	ID             uint64
	Op             Op
	Status         Status
	Flags          uint8
	Dataset        string
	DatasetVersion uint64
	Ring           uint64
	Indices        []uint32
	Sizes          []int64
	Sums           []uint64
	Err            string
}

var (
	// ErrFrame means a peer sent a malformed or oversized frame; the
	// connection is dropped.
	ErrFrame = errors.New("transport: bad frame")
)

// gatherMin is the payload size from which a frame goes out as one writev of
// prefix, header and item bytes, straight from where the items live.
const gatherMin = 32 << 10

// writeFrame writes prefix, header and payload parts (payload written as is).
// With conn set and a large payload, w must be empty and the frame is sent
// with one writev instead of being copied through w.
func writeFrame(w *bufio.Writer, h *Header, payload [][]byte) error {
	return writeFrameTo(nil, w, h, payload)
}

func writeFrameTo(conn net.Conn, w *bufio.Writer, h *Header, payload [][]byte) error {
	var hb bytes.Buffer
	enc := msgpack.NewEncoder(&hb)
	enc.UseCompactInts(true)
	if err := encodeHeader(enc, h); err != nil {
		return err
	}
	if hb.Len() > MaxHeader {
		return fmt.Errorf("transport: header of %d bytes exceeds %d", hb.Len(), MaxHeader)
	}
	var plen uint64
	for _, p := range payload {
		plen += uint64(len(p))
	}
	if plen > MaxPayload {
		return fmt.Errorf("transport: payload of %d bytes exceeds %d", plen, MaxPayload)
	}
	var pre [prefixLen]byte
	binary.BigEndian.PutUint32(pre[:4], uint32(hb.Len()))
	binary.BigEndian.PutUint64(pre[4:], plen)
	if conn != nil && plen >= gatherMin && w.Buffered() == 0 {
		bufs := make(net.Buffers, 0, 2+len(payload))
		bufs = append(bufs, append(pre[:], hb.Bytes()...))
		bufs = append(bufs, payload...)
		_, err := bufs.WriteTo(conn)
		return err
	}
	w.Write(pre[:])
	w.Write(hb.Bytes())
	for _, p := range payload {
		if _, err := w.Write(p); err != nil {
			return err
		}
	}
	return w.Flush()
}

// readFrame reads one frame. The payload is read into a buffer from alloc
// (nil: a fresh one) only after its declared length has been checked against
// maxPayload.
func readFrame(r *bufio.Reader, maxPayload uint64, alloc *bufpool.Pool) (*Header, *bufpool.Buf, error) {
	return readFrameFor(r, func(*Header) uint64 { return maxPayload }, alloc)
}

// readFrameFor is readFrame with a payload bound that depends on the header
// (a request's op), checked before the payload is allocated.
func readFrameFor(r *bufio.Reader, maxPayload func(*Header) uint64, alloc *bufpool.Pool) (*Header, *bufpool.Buf, error) {
	var pre [prefixLen]byte
	if _, err := io.ReadFull(r, pre[:]); err != nil {
		return nil, nil, err
	}
	hlen := binary.BigEndian.Uint32(pre[:4])
	plen := binary.BigEndian.Uint64(pre[4:])
	if hlen == 0 || hlen > MaxHeader {
		return nil, nil, fmt.Errorf("%w: header length %d", ErrFrame, hlen)
	}
	if plen > MaxPayload {
		return nil, nil, fmt.Errorf("%w: payload length %d over %d", ErrFrame, plen, uint64(MaxPayload))
	}
	hb := make([]byte, hlen)
	if _, err := io.ReadFull(r, hb); err != nil {
		return nil, nil, err
	}
	h, err := decodeHeader(hb)
	if err != nil {
		return nil, nil, err
	}
	if limit := maxPayload(h); plen > limit {
		return nil, nil, fmt.Errorf("%w: payload length %d over %d", ErrFrame, plen, limit)
	}
	if plen == 0 {
		return h, nil, nil
	}
	var payload *bufpool.Buf
	if alloc != nil {
		payload = alloc.Get(int(plen))
	} else {
		payload = &bufpool.Buf{B: make([]byte, plen)}
	}
	if _, err := io.ReadFull(r, payload.B); err != nil {
		return nil, nil, err
	}
	return h, payload, nil
}

const headerFields = 11

func encodeHeader(e *msgpack.Encoder, h *Header) error {
	e.EncodeArrayLen(headerFields)
	e.EncodeUint(h.ID)
	e.EncodeUint(uint64(h.Op))
	e.EncodeUint(uint64(h.Status))
	e.EncodeUint(uint64(h.Flags))
	e.EncodeString(h.Dataset)
	e.EncodeUint(h.DatasetVersion)
	e.EncodeUint(h.Ring)
	e.EncodeArrayLen(len(h.Indices))
	for _, i := range h.Indices {
		e.EncodeUint(uint64(i))
	}
	e.EncodeArrayLen(len(h.Sizes))
	for _, s := range h.Sizes {
		e.EncodeInt(s)
	}
	e.EncodeArrayLen(len(h.Sums))
	for _, s := range h.Sums {
		e.EncodeUint(s)
	}
	return e.EncodeString(h.Err)
}

// decodeHeader decodes field by field: msgpack trusts declared lengths, so
// every count is checked against MaxItems and the bytes left before any
// slice is allocated.
func decodeHeader(b []byte) (*Header, error) {
	rd := bytes.NewReader(b)
	d := msgpack.NewDecoder(rd)
	bad := func(what string, err error) (*Header, error) {
		return nil, fmt.Errorf("%w: %s: %v", ErrFrame, what, err)
	}
	n, err := d.DecodeArrayLen()
	if err != nil || n != headerFields {
		return bad("header", fmt.Errorf("array of %d fields, want %d (%v)", n, headerFields, err))
	}
	h := &Header{}
	var u uint64
	if h.ID, err = d.DecodeUint64(); err != nil {
		return bad("id", err)
	}
	if u, err = d.DecodeUint64(); err != nil || u > 255 {
		return bad("op", err)
	}
	h.Op = Op(u)
	if u, err = d.DecodeUint64(); err != nil || u > 255 {
		return bad("status", err)
	}
	h.Status = Status(u)
	if u, err = d.DecodeUint64(); err != nil || u > 255 {
		return bad("flags", err)
	}
	h.Flags = uint8(u)
	if h.Dataset, err = d.DecodeString(); err != nil {
		return bad("dataset", err)
	}
	if h.DatasetVersion, err = d.DecodeUint64(); err != nil {
		return bad("dataset version", err)
	}
	if h.Ring, err = d.DecodeUint64(); err != nil {
		return bad("ring", err)
	}
	count := func(what string) (int, error) {
		n, err := d.DecodeArrayLen()
		if err != nil {
			return 0, fmt.Errorf("%w: %s: %v", ErrFrame, what, err)
		}
		if n < 0 || n > MaxItems || n > rd.Len() {
			return 0, fmt.Errorf("%w: %s: %d entries", ErrFrame, what, n)
		}
		return n, nil
	}
	if n, err = count("indices"); err != nil {
		return nil, err
	}
	h.Indices = make([]uint32, n)
	for i := range h.Indices {
		if u, err = d.DecodeUint64(); err != nil || u > 0xffffffff {
			return bad("index", err)
		}
		h.Indices[i] = uint32(u)
	}
	if n, err = count("sizes"); err != nil {
		return nil, err
	}
	h.Sizes = make([]int64, n)
	for i := range h.Sizes {
		if h.Sizes[i], err = d.DecodeInt64(); err != nil || h.Sizes[i] < -1 {
			return bad("size", err)
		}
	}
	if n, err = count("sums"); err != nil {
		return nil, err
	}
	h.Sums = make([]uint64, n)
	for i := range h.Sums {
		if h.Sums[i], err = d.DecodeUint64(); err != nil {
			return bad("sum", err)
		}
	}
	if h.Err, err = d.DecodeString(); err != nil {
		return bad("error", err)
	}
	if rd.Len() != 0 {
		return bad("header", fmt.Errorf("%d trailing bytes", rd.Len()))
	}
	return h, nil
}
