package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
)

// pushSink is a handler that keeps pushed items with even indices and
// records what it was handed.
type pushSink struct {
	mu   sync.Mutex
	kept map[uint32][]byte
	gets int
}

func (p *pushSink) handle(_ context.Context, req *Request) ([]Item, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]Item, len(req.Indices))
	if !req.Push {
		p.gets++
		return out, nil
	}
	for j, i := range req.Indices {
		if i%2 == 0 {
			// Data is the server's buffer, valid only until the handler returns.
			p.kept[i] = bytes.Clone(req.Data[j])
			out[j].Found = true
		}
	}
	return out, nil
}

func TestPushHandsItemsOver(t *testing.T) {
	sink := &pushSink{kept: map[uint32][]byte{}}
	addr := serveWith(t, key, sink.handle)
	c := NewClient(key)
	defer c.Close()
	req := &Request{Dataset: "d", DatasetVersion: 3, Indices: []uint32{0, 1, 2, 40}}
	for _, i := range req.Indices {
		req.Data = append(req.Data, itemBytes(i))
	}
	// Over gatherMin in all, so the frame goes out as one writev.
	req.Data[3] = bytes.Repeat([]byte("z"), 40<<10)
	kept, err := c.Push(context.Background(), addr, req)
	if err != nil {
		t.Fatal(err)
	}
	if want := []bool{true, false, true, true}; len(kept) != 4 || kept[0] != want[0] || kept[1] != want[1] || kept[2] != want[2] || kept[3] != want[3] {
		t.Fatalf("kept %v, want %v", kept, want)
	}
	for j, i := range req.Indices {
		if got, ok := sink.kept[i]; ok != (i%2 == 0) || (ok && !bytes.Equal(got, req.Data[j])) {
			t.Fatalf("item %d: kept %v with %d bytes", i, ok, len(got))
		}
	}
	if req.Sums[3] != xxhash.Sum64(req.Data[3]) {
		t.Fatal("Push did not report the sums it sent")
	}
	// The same connection still serves gets.
	if _, err := c.Get(context.Background(), addr, &Request{Dataset: "d", Indices: []uint32{4}}); err != nil || sink.gets != 1 {
		t.Fatalf("get after push: %v (%d gets)", err, sink.gets)
	}
}

func TestPushOverTheLimitIsNotSent(t *testing.T) {
	sink := &pushSink{kept: map[uint32][]byte{}}
	addr := serveWith(t, key, sink.handle)
	c := NewClient(key)
	defer c.Close()
	big := make([]byte, MaxPush/2+1)
	if _, err := c.Push(context.Background(), addr, &Request{Dataset: "d", Indices: []uint32{0, 2}, Data: [][]byte{big, big}}); err == nil {
		t.Fatal("a push over MaxPush was sent")
	}
	if _, err := c.Push(context.Background(), addr, &Request{Dataset: "d", Indices: []uint32{0, 2}, Data: [][]byte{big}}); err == nil {
		t.Fatal("a push with fewer items than indices was sent")
	}
	if len(sink.kept) != 0 {
		t.Fatalf("%d items kept from refused pushes", len(sink.kept))
	}
}

// dialAuthed opens a peer connection past the handshake, as a raw socket.
func dialAuthed(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if err := clientHandshake(c, key); err != nil {
		c.Close()
		t.Fatal(err)
	}
	return c
}

// rawPush writes a push frame as a buggy or hostile peer could and returns
// the server's answer, or nil when it dropped the connection.
func rawPush(t *testing.T, addr string, h *Header, payload []byte) *Header {
	t.Helper()
	c := dialAuthed(t, addr)
	defer c.Close()
	bw := bufio.NewWriter(c)
	if err := writeFrame(bw, h, [][]byte{payload}); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, _, err := readFrame(bufio.NewReader(c), MaxPayload, nil)
	if isTimeout(err) {
		t.Fatal("no answer and no close")
	}
	if err != nil {
		return nil
	}
	return resp
}

func TestBadPushesChangeNothing(t *testing.T) {
	sink := &pushSink{kept: map[uint32][]byte{}}
	addr := serveWith(t, key, sink.handle)
	item := []byte("sample bytes")
	good := func() *Header {
		return &Header{ID: 1, Op: OpPush, Dataset: "d", Indices: []uint32{0}, Sizes: []int64{int64(len(item))}, Sums: []uint64{xxhash.Sum64(item)}}
	}

	// A wrong sum is answered with an error; the handler never sees it.
	h := good()
	h.Sums[0]++
	if resp := rawPush(t, addr, h, item); resp == nil || resp.Status != StatusError || !strings.Contains(resp.Err, "checksum") {
		t.Fatalf("wrong sum: %+v", resp)
	}
	// Shapes no honest peer sends drop the connection.
	drops := map[string]func(h *Header) []byte{
		"sizes beyond the payload": func(h *Header) []byte { h.Sizes[0]++; return item },
		"stray payload bytes":      func(h *Header) []byte { return append(bytes.Clone(item), '!') },
		"no sums":                  func(h *Header) []byte { h.Sums = nil; return item },
		"a push marked handoff":    func(h *Header) []byte { h.Flags = FlagHandoff; return item },
		"a get with a payload":     func(h *Header) []byte { h.Op, h.Sizes, h.Sums = OpGet, nil, nil; return item },
		"an unknown op":            func(h *Header) []byte { h.Op = 9; return item },
	}
	for name, mangle := range drops {
		h := good()
		payload := mangle(h)
		if resp := rawPush(t, addr, h, payload); resp != nil {
			t.Errorf("%s: answered %+v, want the connection dropped", name, resp)
		}
	}
	if len(sink.kept) != 0 || sink.gets != 0 {
		t.Fatalf("bad pushes reached the handler: %d kept, %d gets", len(sink.kept), sink.gets)
	}
	// And the honest push still works.
	if resp := rawPush(t, addr, good(), item); resp == nil || resp.Status != StatusOK || len(resp.Sizes) != 1 || resp.Sizes[0] != 0 {
		t.Fatalf("good push: %+v", resp)
	}
	if !bytes.Equal(sink.kept[0], item) {
		t.Fatal("good push not kept")
	}
}

// A push frame over MaxPush is refused from its prefix, before its payload
// is allocated or read.
func TestOversizedPushIsDroppedUnread(t *testing.T) {
	sink := &pushSink{kept: map[uint32][]byte{}}
	addr := serveWith(t, key, sink.handle)
	var hb bytes.Buffer
	bw := bufio.NewWriter(&hb)
	if err := writeFrame(bw, &Header{ID: 1, Op: OpPush, Dataset: "d", Indices: []uint32{0}, Sizes: []int64{MaxPush + 1}, Sums: []uint64{1}}, nil); err != nil {
		t.Fatal(err)
	}
	frame := hb.Bytes()
	// Declare MaxPush+1 payload bytes and send none of them.
	binary.BigEndian.PutUint64(frame[4:prefixLen], MaxPush+1)
	c := dialAuthed(t, addr)
	defer c.Close()
	c.Write(frame)
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := bufio.NewReader(c).ReadByte(); err == nil || isTimeout(err) {
		t.Fatalf("connection not dropped (%v)", err)
	}
}
