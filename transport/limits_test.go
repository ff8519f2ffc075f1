package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
)

// rawHeader encodes a header's layout with values no Header can hold, as a
// hostile peer could send them.
func rawHeader(t *testing.T, op, status, flags uint64, indices []uint64) []byte {
	t.Helper()
	var b bytes.Buffer
	e := msgpack.NewEncoder(&b)
	e.UseCompactInts(true)
	e.EncodeArrayLen(headerFields)
	for _, v := range []uint64{7, op, status, flags} {
		e.EncodeUint(v)
	}
	e.EncodeString("ds")
	e.EncodeUint(1)
	e.EncodeUint(2)
	e.EncodeArrayLen(len(indices))
	for _, i := range indices {
		e.EncodeUint(i)
	}
	e.EncodeArrayLen(0)
	e.EncodeArrayLen(0)
	if err := e.EncodeString(""); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// Every limit on what a peer may send holds exactly at its bound: the
// largest legal value passes and the next one is refused.
func TestHeaderFieldLimitsAreExact(t *testing.T) {
	for _, c := range []struct {
		name              string
		op, status, flags uint64
		indices           []uint64
		ok                bool
	}{
		{"op 255", 255, 0, 0, nil, true},
		{"op 256", 256, 0, 0, nil, false},
		{"status 255", 1, 255, 0, nil, true},
		{"status 256", 1, 256, 0, nil, false},
		{"flags 255", 1, 0, 255, nil, true},
		{"flags 256", 1, 0, 256, nil, false},
		{"index 2^32-1", 1, 0, 0, []uint64{0xffffffff}, true},
		{"index 2^32", 1, 0, 0, []uint64{1 << 32}, false},
		{"MaxItems indices", 1, 0, 0, make([]uint64, MaxItems), true},
		{"MaxItems+1 indices", 1, 0, 0, make([]uint64, MaxItems+1), false},
	} {
		h, err := decodeHeader(rawHeader(t, c.op, c.status, c.flags, c.indices))
		if c.ok && (err != nil || uint64(h.Op) != c.op%256 || uint64(h.Status) != c.status || uint64(h.Flags) != c.flags || len(h.Indices) != len(c.indices)) {
			t.Errorf("%s: refused or changed: %+v %v", c.name, h, err)
		}
		if !c.ok && !errors.Is(err, ErrFrame) {
			t.Errorf("%s: %v, want ErrFrame", c.name, err)
		}
	}
}

// frame builds a frame's bytes with a header of exactly hlen bytes (the
// dataset name pads it) and a declared payload of plen bytes.
func frame(t *testing.T, hlen int, plen uint64) []byte {
	t.Helper()
	h := &Header{ID: 1, Op: OpGet}
	var hb []byte
	for pad := max(hlen-32, 0); ; pad++ {
		var b bytes.Buffer
		h.Dataset = strings.Repeat("d", pad)
		e := msgpack.NewEncoder(&b)
		e.UseCompactInts(true)
		if err := encodeHeader(e, h); err != nil {
			t.Fatal(err)
		}
		if b.Len() == hlen {
			hb = b.Bytes()
			break
		}
		if b.Len() > hlen {
			t.Fatalf("no header of exactly %d bytes", hlen)
		}
	}
	out := make([]byte, prefixLen, prefixLen+len(hb)+int(plen))
	binary.BigEndian.PutUint32(out[:4], uint32(len(hb)))
	binary.BigEndian.PutUint64(out[4:], plen)
	out = append(out, hb...)
	return append(out, make([]byte, plen)...)
}

func TestFrameLimitsAreExact(t *testing.T) {
	read := func(b []byte, maxPayload uint64) error {
		_, _, err := readFrame(bufio.NewReader(bytes.NewReader(b)), maxPayload, nil)
		return err
	}
	if err := read(frame(t, MaxHeader, 0), 0); err != nil {
		t.Errorf("a header of exactly MaxHeader bytes: %v", err)
	}
	big := frame(t, MaxHeader+1, 0)
	if err := read(big, 0); !errors.Is(err, ErrFrame) {
		t.Errorf("a header of MaxHeader+1 bytes: %v, want ErrFrame", err)
	}
	if err := read(frame(t, 40, 100), 100); err != nil {
		t.Errorf("a payload of exactly the limit: %v", err)
	}
	if err := read(frame(t, 40, 101), 100); !errors.Is(err, ErrFrame) {
		t.Errorf("a payload one byte over the limit: %v, want ErrFrame", err)
	}
	zero := frame(t, 40, 0)
	binary.BigEndian.PutUint32(zero[:4], 0)
	if err := read(zero, 0); !errors.Is(err, ErrFrame) {
		t.Errorf("a header of 0 bytes: %v, want ErrFrame", err)
	}

	// Writing holds itself to the same limits.
	w := bufio.NewWriter(io.Discard)
	h := &Header{ID: 1, Op: OpGet}
	for pad := MaxHeader - 40; ; pad++ {
		h.Dataset = strings.Repeat("d", pad)
		var b bytes.Buffer
		e := msgpack.NewEncoder(&b)
		e.UseCompactInts(true)
		if err := encodeHeader(e, h); err != nil {
			t.Fatal(err)
		}
		if b.Len() == MaxHeader {
			break
		}
		if b.Len() > MaxHeader {
			t.Fatal("no header of exactly MaxHeader bytes")
		}
	}
	if err := writeFrame(w, h, nil); err != nil {
		t.Errorf("writing a header of MaxHeader bytes: %v", err)
	}
	h.Dataset += "d"
	if err := writeFrame(w, h, nil); err == nil {
		t.Error("wrote a header of MaxHeader+1 bytes")
	}
	chunk := make([]byte, 64<<20)
	payload := make([][]byte, MaxPayload/len(chunk))
	for i := range payload {
		payload[i] = chunk
	}
	h.Dataset = "d"
	if err := writeFrame(w, h, payload); err != nil {
		t.Errorf("writing a payload of exactly MaxPayload bytes: %v", err)
	}
	if err := writeFrame(w, h, append(payload, []byte{1})); err == nil {
		t.Error("wrote a payload of MaxPayload+1 bytes")
	}
}

// A request of MaxItems indices is served in full; one more is refused
// before anything is sent.
func TestRequestItemLimitIsExact(t *testing.T) {
	addr, calls := serve(t, key)
	c := NewClient(key)
	defer c.Close()
	idx := make([]uint32, MaxItems)
	for i := range idx {
		idx[i] = uint32(i % 50)
	}
	res, err := c.Get(context.Background(), addr, &Request{Dataset: "d", Indices: idx})
	if err != nil || len(res) != MaxItems {
		t.Fatalf("MaxItems indices: %d results, %v", len(res), err)
	}
	for j, r := range res {
		if !bytes.Equal(r.Data, itemBytes(idx[j])) {
			t.Fatalf("item %d: wrong bytes", j)
		}
	}
	before := calls.Load()
	if _, err := c.Get(context.Background(), addr, &Request{Dataset: "d", Indices: append(idx, 1)}); err == nil {
		t.Fatal("MaxItems+1 indices were sent")
	}
	if calls.Load() != before {
		t.Fatal("a refused request reached the server")
	}
}

// An empty item is an item: found, zero bytes, not a miss.
func TestEmptyItemIsFound(t *testing.T) {
	h := func(ctx context.Context, req *Request) ([]Item, error) {
		return []Item{{Data: []byte{}, Sum: xxhash.Sum64(nil), Found: true}}, nil
	}
	addr := serveWith(t, key, h)
	c := NewClient(key)
	defer c.Close()
	res, err := c.Get(context.Background(), addr, &Request{Dataset: "d", Indices: []uint32{3}})
	if err != nil || len(res) != 1 || !res[0].Found || len(res[0].Data) != 0 {
		t.Fatalf("empty item: %+v %v", res, err)
	}
}

// A peer that declares more item bytes than its frame carries is a
// protocol error, not a read past the payload.
func TestSizesBeyondPayloadAreRefused(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		if serverHandshake(conn, key) != nil {
			return
		}
		br, bw := bufio.NewReader(conn), bufio.NewWriter(conn)
		req, _, err := readFrame(br, 0, nil)
		if err != nil {
			return
		}
		payload := []byte("12345")
		writeFrame(bw, &Header{ID: req.ID, Op: req.Op, Status: StatusOK, Sizes: []int64{10}, Sums: []uint64{xxhash.Sum64(payload)}},
			[][]byte{payload})
		br.ReadByte() // hold the connection until the client drops it
	}()
	c := NewClient(key)
	defer c.Close()
	if _, err := c.Get(context.Background(), ln.Addr().String(), &Request{Dataset: "d", Indices: []uint32{1}}); !errors.Is(err, ErrFrame) {
		t.Fatalf("sizes beyond the payload: %v, want ErrFrame", err)
	}
}
