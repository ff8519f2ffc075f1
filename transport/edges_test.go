package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"stallfree/internal/testutil"
)

// A push of exactly MaxItems items (one of them empty) and a push of exactly
// MaxPush bytes are sent and handed over whole.
func TestPushAtItsLimits(t *testing.T) {
	sink := &pushSink{kept: map[uint32][]byte{}}
	addr := serveWith(t, key, sink.handle)
	c := NewClient(key)
	defer c.Close()

	many := &Request{Dataset: "d"}
	for j := range MaxItems {
		many.Indices = append(many.Indices, uint32(2*j))
		many.Data = append(many.Data, bytes.Repeat([]byte{byte(j)}, min(j, 3)))
	}
	kept, err := c.Push(context.Background(), addr, many)
	if err != nil {
		t.Fatalf("a push of exactly MaxItems items: %v", err)
	}
	for j, i := range many.Indices {
		if got, ok := sink.kept[i]; !kept[j] || !ok || !bytes.Equal(got, many.Data[j]) {
			t.Fatalf("item %d of %d bytes: kept %v, handed %v with %d bytes", i, len(many.Data[j]), kept[j], ok, len(got))
		}
	}

	half := bytes.Repeat([]byte("h"), MaxPush/2)
	full := &Request{Dataset: "d", Indices: []uint32{10000, 10002}, Data: [][]byte{half, half}}
	if kept, err := c.Push(context.Background(), addr, full); err != nil || !kept[0] || !kept[1] {
		t.Fatalf("a push of exactly MaxPush bytes: kept %v, %v", kept, err)
	}
	if got := sink.kept[10002]; !bytes.Equal(got, half) {
		t.Fatalf("the second half arrived as %d bytes", len(got))
	}
}

// A frame declaring exactly MaxPayload bytes passes the prefix check and is
// read on (here it is cut short); one byte more is refused unread.
func TestPayloadOfMaxPayloadIsRead(t *testing.T) {
	declare := func(plen uint64) error {
		b := frame(t, 40, 0)
		binary.BigEndian.PutUint64(b[4:prefixLen], plen)
		_, _, err := readFrame(bufio.NewReader(bytes.NewReader(b)), MaxPayload, nil)
		return err
	}
	if err := declare(MaxPayload); !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		t.Fatalf("a frame of exactly MaxPayload bytes, cut short: %v, want the end of its input", err)
	}
	if err := declare(MaxPayload + 1); !errors.Is(err, ErrFrame) {
		t.Fatalf("a frame of MaxPayload+1 bytes: %v, want ErrFrame", err)
	}
}

// warnings records the messages a server logs at Warn or above.
type warnings struct {
	mu   sync.Mutex
	msgs []string
}

func (w *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (w *warnings) WithAttrs([]slog.Attr) slog.Handler       { return w }
func (w *warnings) WithGroup(string) slog.Handler            { return w }
func (w *warnings) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		w.mu.Lock()
		w.msgs = append(w.msgs, r.Message)
		w.mu.Unlock()
	}
	return nil
}

func (w *warnings) count() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.msgs)
}

// A peer that hangs up between frames is not worth a warning; one that sends
// a frame the protocol refuses is. Serve ends with nil when the server is
// closed, not with the listener's error.
func TestDroppedConnectionsLoggedAndServeEndsCleanly(t *testing.T) {
	var warned warnings
	s := NewServer(key, func(context.Context, *Request) ([]Item, error) { return nil, nil }, slog.New(&warned))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- s.Serve(ln) }()
	addr := ln.Addr().String()
	connections := func() int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.conns)
	}
	awaitNoConnections := func() {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); connections() != 0; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d connections still open on the server", connections())
			}
		}
	}

	polite := dialAuthed(t, addr)
	polite.Close()
	awaitNoConnections()
	if n := warned.count(); n != 0 {
		t.Fatalf("a peer hanging up between frames logged %d warnings: %v", n, warned.msgs)
	}

	rude := dialAuthed(t, addr)
	huge := make([]byte, prefixLen)
	binary.BigEndian.PutUint32(huge, 10)
	binary.BigEndian.PutUint64(huge[4:], 1<<40)
	if _, err := rude.Write(huge); err != nil {
		t.Fatal(err)
	}
	awaitNoConnections()
	rude.Close()
	if n := warned.count(); n != 1 {
		t.Fatalf("a refused frame logged %d warnings, want 1: %v", n, warned.msgs)
	}

	// Handshakes without the key, which anyone can send: one line for many.
	testutil.KnockWithoutKey(t, addr, 20)
	if n := warned.count(); n != 2 {
		t.Fatalf("20 refused handshakes logged %d warnings in all, want 2 (one for the frame, one for them): %v", n, warned.msgs)
	}

	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve after Close: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
}

// countingListener counts the connections a server accepts.
type countingListener struct {
	net.Listener
	accepted atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// Many requests at once to a peer the client has no connection to yet open
// at most connsPerPeer connections: one dial at a time, the rest wait for it
// (a burst of dials is a burst of SYNs and handshakes on a loaded peer).
func TestBurstToANewPeerDialsOnceAtATime(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &countingListener{Listener: raw}
	s := NewServer(key, func(_ context.Context, req *Request) ([]Item, error) {
		b := itemBytes(req.Indices[0])
		return []Item{{Data: b, Sum: xxhash.Sum64(b), Found: true}}, nil
	}, slog.New(slog.DiscardHandler))
	go s.Serve(ln)
	defer s.Close()
	c := NewClient(key)
	defer c.Close()
	start := make(chan struct{})
	errs := make(chan error, 32)
	for g := range 32 {
		go func() {
			<-start
			res, err := c.Get(context.Background(), raw.Addr().String(), &Request{Dataset: "d", Indices: []uint32{uint32(g)}})
			if err == nil && !bytes.Equal(res[0].Data, itemBytes(uint32(g))) {
				err = fmt.Errorf("item %d: wrong bytes", g)
			}
			errs <- err
		}()
	}
	close(start)
	for range 32 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	if n := ln.accepted.Load(); n > connsPerPeer {
		t.Fatalf("32 requests at once opened %d connections; at most %d", n, connsPerPeer)
	}
}
