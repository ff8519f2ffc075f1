package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"stallfree/bufpool"
)

var key = []byte("cluster-key-for-tests-0123456789")

func itemBytes(i uint32) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("%08d", i)), int(i%50)*100+1)
}

// serve starts a server whose items are the index rendered as text; index
// 999 is "not held".
func serve(t *testing.T, k []byte) (string, *atomic.Int64) {
	t.Helper()
	var calls atomic.Int64
	h := func(ctx context.Context, req *Request) ([]Item, error) {
		calls.Add(1)
		if req.Dataset == "boom" {
			return nil, errors.New("boom")
		}
		if req.Dataset == "corrupt" { // bytes that do not match the sum sent with them
			out := make([]Item, len(req.Indices))
			for j, i := range req.Indices {
				b := itemBytes(i)
				out[j] = Item{Data: append([]byte("X"), b[1:]...), Sum: xxhash.Sum64(b), Found: true}
			}
			return out, nil
		}
		out := make([]Item, len(req.Indices))
		for j, i := range req.Indices {
			if i == 999 {
				continue
			}
			b := itemBytes(i)
			out[j] = Item{Data: b, Sum: xxhash.Sum64(b), Found: true}
		}
		return out, nil
	}
	return serveWith(t, k, h), &calls
}

// serveWith starts a server with handler h on a loopback port until the
// test ends, and returns its address.
func serveWith(t *testing.T, k []byte, h Handler) string {
	t.Helper()
	s := NewServer(k, h, slog.New(slog.DiscardHandler))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	return ln.Addr().String()
}

func TestGetBatchConcurrent(t *testing.T) {
	addr, _ := serve(t, key)
	c := NewClient(key)
	defer c.Close()
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			idx := []uint32{uint32(g), 999, uint32(g + 100)}
			res, err := c.Get(context.Background(), addr, &Request{Dataset: "d", Indices: idx})
			if err != nil {
				t.Error(err)
				return
			}
			if !res[0].Found || !bytes.Equal(res[0].Data, itemBytes(uint32(g))) || res[1].Found || !bytes.Equal(res[2].Data, itemBytes(uint32(g+100))) {
				t.Errorf("goroutine %d: wrong results", g)
			}
		}()
	}
	wg.Wait()
	if _, err := c.Get(context.Background(), addr, &Request{Dataset: "boom", Indices: []uint32{1}}); err == nil {
		t.Fatal("handler error not reported")
	}
	// The connection survives a handler error.
	if _, err := c.Get(context.Background(), addr, &Request{Dataset: "d", Indices: []uint32{1}}); err != nil {
		t.Fatal(err)
	}
}

// A peer's bytes that do not match the checksum it sent are never handed
// on, single item or batch.
func TestCorruptPayloadFailsTheFetch(t *testing.T) {
	addr, _ := serve(t, key)
	c := NewClient(key)
	defer c.Close()
	for _, idx := range [][]uint32{{7}, {1, 2, 3}} {
		res, err := c.Get(context.Background(), addr, &Request{Dataset: "corrupt", Indices: idx})
		if err == nil {
			t.Fatalf("indices %v: corrupt bytes accepted: %q", idx, res[0].Data[:8])
		}
	}
	// The same items with their true bytes come through.
	if _, err := c.Get(context.Background(), addr, &Request{Dataset: "d", Indices: []uint32{7}}); err != nil {
		t.Fatal(err)
	}
}

func TestWrongKeyRefusedBothWays(t *testing.T) {
	addr, calls := serve(t, key)
	c := NewClient([]byte("another-cluster-key-0123456789ab"))
	defer c.Close()
	if _, err := c.Get(context.Background(), addr, &Request{Dataset: "d", Indices: []uint32{1}}); !errors.Is(err, ErrAuth) {
		t.Fatalf("stranger client: %v", err)
	}
	// A server without the key cannot impersonate a peer either.
	fake, _ := serve(t, []byte("imposter"))
	good := NewClient(key)
	defer good.Close()
	if _, err := good.Get(context.Background(), fake, &Request{Dataset: "d", Indices: []uint32{1}}); !errors.Is(err, ErrAuth) {
		t.Fatalf("imposter server: %v", err)
	}
	if calls.Load() != 0 {
		t.Fatalf("%d requests served to a stranger", calls.Load())
	}
}

// Garbage, truncated frames, huge declared lengths and silent connections are
// dropped without growing memory, and other connections keep working.
func TestGarbageIsDropped(t *testing.T) {
	addr, calls := serve(t, key)
	good := NewClient(key)
	defer good.Close()
	if _, err := good.Get(context.Background(), addr, &Request{Dataset: "d", Indices: []uint32{7}}); err != nil {
		t.Fatal(err)
	}
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	authed := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		if err := clientHandshake(c, key); err != nil {
			t.Fatal(err)
		}
		return c
	}
	huge := func(hlen uint32, plen uint64) []byte {
		b := make([]byte, prefixLen)
		binary.BigEndian.PutUint32(b, hlen)
		binary.BigEndian.PutUint64(b[4:], plen)
		return b
	}
	// A header claiming 20 M indices in 6 bytes.
	bomb := []byte{0x9b, 0x01, 0x01, 0x00, 0x00, 0xa0, 0x00, 0x00, 0xdd, 0x01, 0x31, 0x2d, 0x00}
	cases := map[string][]byte{
		"unauthenticated garbage": []byte("GET / HTTP/1.1\r\n\r\n"),
		"huge header length":      huge(1<<31, 0),
		"huge payload length":     huge(10, 1<<40),
		"payload on a request":    append(huge(1, 5), 0xc0, 1, 2, 3, 4, 5),
		"array bomb":              append(huge(uint32(len(bomb)), 0), bomb...),
		"truncated":               huge(100, 0)[:7],
	}
	for name, b := range cases {
		var c net.Conn
		if name == "unauthenticated garbage" {
			c, _ = net.Dial("tcp", addr)
		} else {
			c = authed()
		}
		c.Write(b)
		if name == "truncated" {
			c.Close()
			continue
		}
		// The server must close the connection.
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := bufio.NewReader(c).ReadByte(); err == nil || isTimeout(err) {
			t.Errorf("%s: connection not dropped (%v)", name, err)
		}
		c.Close()
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grown := int64(after.HeapAlloc) - int64(before.HeapAlloc); grown > 16<<20 {
		t.Errorf("heap grew by %d bytes on garbage", grown)
	}
	if _, err := good.Get(context.Background(), addr, &Request{Dataset: "d", Indices: []uint32{8}}); err != nil {
		t.Fatalf("good connection hurt: %v", err)
	}
	if calls.Load() != 2 {
		t.Fatalf("%d handler calls, want 2", calls.Load())
	}
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestHungPeerTimesOut(t *testing.T) {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			serverHandshake(c, key) // then never answers
		}
	}()
	c := NewClient(key)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	// The deterministic part: the fetch ends with the caller's deadline, not
	// with some later error of the connection (how fast is for benchmarks).
	_, err := c.Get(ctx, ln.Addr().String(), &Request{Dataset: "d", Indices: []uint32{1}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a hung peer: err %v, want the caller's deadline", err)
	}
}

func TestHeaderRoundTrip(t *testing.T) {
	h := &Header{ID: 1 << 40, Op: OpGet, Flags: FlagHandoff, Dataset: "imagenet", DatasetVersion: 9, Ring: 1<<63 + 5,
		Indices: []uint32{0, 1 << 31}, Sizes: []int64{-1, 5}, Sums: []uint64{0, 1 << 63}, Err: "x"}
	var buf bytes.Buffer
	bw := bufio.NewWriter(&buf)
	if err := writeFrame(bw, h, [][]byte{[]byte("hello")}); err != nil {
		t.Fatal(err)
	}
	got, payload, err := readFrame(bufio.NewReader(&buf), MaxPayload, nil)
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != fmt.Sprint(h) || string(payload.B) != "hello" {
		t.Fatalf("got %+v %q", got, payload.B)
	}
}

func FuzzReadFrame(f *testing.F) {
	var buf bytes.Buffer
	bw := bufio.NewWriter(&buf)
	writeFrame(bw, &Header{ID: 1, Op: OpGet, Dataset: "d", Indices: []uint32{1, 2}}, nil)
	f.Add(buf.Bytes())
	f.Add([]byte{0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0x93, 1, 2})
	f.Fuzz(func(t *testing.T, b []byte) {
		h, _, err := readFrame(bufio.NewReader(bytes.NewReader(b)), 1<<20, &bufpool.Pool{})
		if err != nil {
			return
		}
		if len(h.Indices) > MaxItems || len(h.Sizes) > MaxItems || len(h.Sums) > MaxItems {
			t.Fatalf("accepted %d/%d/%d entries", len(h.Indices), len(h.Sizes), len(h.Sums))
		}
		// What decodes must re-encode to an equal header.
		var out bytes.Buffer
		if err := writeFrame(bufio.NewWriter(&out), h, nil); err != nil {
			t.Fatal(err)
		}
		h2, _, err := readFrame(bufio.NewReader(&out), 0, nil)
		if err != nil || fmt.Sprint(h2) != fmt.Sprint(h) {
			t.Fatalf("round trip: %v %+v vs %+v", err, h2, h)
		}
	})
}

// A request the handler cannot answer inline is retried on its own
// goroutine, and while it blocks, inline answers on the same connection go on.
func TestBlockingRequestDoesNotHoldTheConnection(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, connsPerPeer)
	var inline, blocking atomic.Int64
	h := func(ctx context.Context, req *Request) ([]Item, error) {
		if req.Dataset == "slow" {
			if req.Inline {
				inline.Add(1)
				return nil, ErrWouldBlock
			}
			blocking.Add(1)
			started <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		b := itemBytes(req.Indices[0])
		return []Item{{Data: b, Sum: xxhash.Sum64(b), Found: true}}, nil
	}
	addr := serveWith(t, key, h)
	c := NewClient(key)
	defer c.Close()
	slow := make(chan error, connsPerPeer)
	for range connsPerPeer { // one blocked request on every pooled connection
		go func() {
			_, err := c.Get(context.Background(), addr, &Request{Dataset: "slow", Indices: []uint32{3}})
			slow <- err
		}()
	}
	for range connsPerPeer {
		<-started
	}
	for i := range uint32(20) {
		res, err := c.Get(context.Background(), addr, &Request{Dataset: "fast", Indices: []uint32{i}})
		if err != nil || !bytes.Equal(res[0].Data, itemBytes(i)) {
			t.Fatalf("fast request %d behind a blocked one: %v", i, err)
		}
	}
	close(release)
	for range connsPerPeer {
		if err := <-slow; err != nil {
			t.Fatal(err)
		}
	}
	if inline.Load() != connsPerPeer || blocking.Load() != connsPerPeer {
		t.Fatalf("slow requests: %d inline tries, %d blocking calls; want %d each", inline.Load(), blocking.Load(), connsPerPeer)
	}
}

func TestRecycledResultsStayExact(t *testing.T) {
	addr, _ := serve(t, key)
	c := NewClient(key)
	defer c.Close()
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := range 200 {
				i := uint32(g*200 + n)
				if i == 999 { // not held by serve
					continue
				}
				res, err := c.Get(context.Background(), addr, &Request{Dataset: "d", Indices: []uint32{i}})
				if err != nil {
					t.Error(err)
					return
				}
				if !bytes.Equal(res[0].Data, itemBytes(i)) {
					t.Errorf("item %d: wrong bytes", i)
					return
				}
				res[0].Recycle()
				res[0].Recycle() // a second call must be harmless
				if res[0].Data != nil {
					t.Error("Data still set after Recycle")
				}
			}
		}()
	}
	wg.Wait()
	// Results of a several-index request share one buffer and own none of it.
	res, err := c.Get(context.Background(), addr, &Request{Dataset: "d", Indices: []uint32{3, 4}})
	if err != nil {
		t.Fatal(err)
	}
	res[0].Recycle()
	if !bytes.Equal(res[0].Data, itemBytes(3)) || !bytes.Equal(res[1].Data, itemBytes(4)) {
		t.Fatal("Recycle touched a result that shares its buffer")
	}
}

// Ping answers only for a running peer with the key: a listening socket that
// never answers (a stopped process) fails at the caller's deadline, a closed
// port and a stranger fail at once, and no ping reaches the handler.
func TestPingNeedsAnAnsweringPeer(t *testing.T) {
	addr, calls := serve(t, key)
	c := NewClient(key)
	defer c.Close()
	if err := c.Ping(context.Background(), addr); err != nil {
		t.Fatalf("a running peer: %v", err)
	}
	stranger, _ := serve(t, []byte("imposter"))
	if err := c.Ping(context.Background(), stranger); !errors.Is(err, ErrAuth) {
		t.Fatalf("a peer without the key: %v, want ErrAuth", err)
	}
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close() // accepts by the kernel's backlog, never answers
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := c.Ping(ctx, silent.Addr().String()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a silent listener: %v, want the caller's deadline", err)
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()
	if err := c.Ping(context.Background(), closedAddr); err == nil {
		t.Fatal("a closed port answered a ping")
	}
	if calls.Load() != 0 {
		t.Fatalf("%d pings reached the handler", calls.Load())
	}
}

// A member asks another for its figures: the answer is what that member's
// Figures says, typed; a member that keeps none answers an error, and the
// connection stays usable for items.
func TestFigures(t *testing.T) {
	s := NewServer(key, func(_ context.Context, req *Request) ([]Item, error) {
		b := itemBytes(req.Indices[0])
		return []Item{{Data: b, Sum: xxhash.Sum64(b), Found: true}}, nil
	}, slog.New(slog.DiscardHandler))
	asked := 0
	s.Figures = func() Figures { asked++; return Figures{Items: 42, Bytes: 4200} }
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: raw}
	go s.Serve(ln)
	t.Cleanup(func() { s.Close() })
	c := NewClient(key)
	defer c.Close()
	ctx := context.Background()
	for round := 1; round <= 6; round++ {
		f, err := c.Figures(ctx, ln.Addr().String())
		if err != nil || f != (Figures{Items: 42, Bytes: 4200}) || asked != round {
			t.Fatalf("figures %+v, %v, asked %d times", f, err, asked)
		}
		if res, err := c.Get(ctx, ln.Addr().String(), &Request{Dataset: "d", Indices: []uint32{7}}); err != nil || !bytes.Equal(res[0].Data, itemBytes(7)) {
			t.Fatalf("a get after the figures: %v", err)
		}
	}
	// An answer of figures leaves its connection open: six rounds need no
	// more connections than the pool keeps.
	if n := ln.accepted.Load(); n > connsPerPeer {
		t.Fatalf("%d connections for six rounds of figures and gets, want at most %d", n, connsPerPeer)
	}
	none := serveWith(t, key, func(context.Context, *Request) ([]Item, error) { return nil, nil })
	if _, err := c.Figures(ctx, none); err == nil || !strings.Contains(err.Error(), "keeps no figures") {
		t.Fatalf("a member without figures: %v", err)
	}
}
