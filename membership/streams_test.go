package membership

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"
)

func streamHeader(size uint32) []byte {
	h := []byte{encryptMsg, 0, 0, 0, 0}
	binary.BigEndian.PutUint32(h[1:], size)
	return h
}

// hungUp reports whether the node closed c without a byte for it.
func hungUp(t *testing.T, c net.Conn) bool {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	n, err := c.Read(make([]byte, 1))
	// EOF, or a reset where the node closed with our bytes unread.
	return n == 0 && (err == io.EOF || errors.Is(err, syscall.ECONNRESET))
}

// Gossip streams reach memberlist only within bounds. A stream whose
// header declares more than any cluster's state, or more than the room the
// other streams leave, is closed before its body is read; one that sends
// no header in time is closed; past the streams one address may hold, the
// next is closed until one ends. An admitted stream reads from its first
// byte, the header put back, and its charge is given back when it closes.
func TestGossipStreamsAreBounded(t *testing.T) {
	tr, err := newStreamTransport("127.0.0.1", 0, true, stdlog.New(io.Discard, "", 0), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tr.GetAutoBindPort()))
	from := "127.0.0.1"
	dial := func(b []byte) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		return c
	}
	accepted := func() net.Conn {
		t.Helper()
		select {
		case c := <-tr.StreamCh():
			return c
		case <-time.After(10 * time.Second):
			t.Fatal("no stream handed to memberlist")
			return nil
		}
	}
	charged := func() (int, int64) {
		tr.mu.Lock()
		defer tr.mu.Unlock()
		return tr.open, tr.bytes
	}

	if c := dial(streamHeader(maxStreamBytes + 1)); !hungUp(t, c) {
		t.Fatal("a stream declaring more than maxStreamBytes was not closed")
	}
	if c := dial(nil); !hungUp(t, c) { // silent: closed after headerWait
		t.Fatal("a stream that sent no header was not closed")
	}
	body := append(streamHeader(3), "abc"...)
	dial(body)
	got := make([]byte, len(body))
	first := accepted()
	if _, err := io.ReadFull(first, got); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("an admitted stream read %q, %v; want %q", got, err, body)
	}
	first.Close()
	if open, declared := charged(); open != 0 || declared != 0 {
		t.Fatalf("%d streams and %d bytes still charged after the stream closed", open, declared)
	}
	// One address may declare half the budget: two streams of the largest.
	var held []net.Conn
	for range streamBudget / 2 / maxStreamBytes {
		dial(streamHeader(maxStreamBytes))
		held = append(held, accepted())
	}
	if c := dial(streamHeader(maxStreamBytes)); !hungUp(t, c) {
		t.Fatal("a stream past the budget one address may declare was not closed")
	}
	for _, c := range held {
		c.Close()
	}
	// And hold half the streams.
	held = held[:0]
	for len(held) < maxStreams/2 {
		dial(streamHeader(1))
		held = append(held, accepted())
	}
	if c := dial(streamHeader(1)); !hungUp(t, c) {
		t.Fatalf("stream %d from one address, of at most %d, was not closed", maxStreams/2+1, maxStreams/2)
	}
	held[0].Close() // memberlist is done with one: room for one more
	held = held[1:]
	dial(streamHeader(1))
	held = append(held, accepted())
	// Other addresses fill the rest: maxStreams in all.
	for _, other := range []string{"127.0.0.2", "127.0.0.3"} {
		from = other
		for len(held) < maxStreams {
			if n := len(held); other == "127.0.0.2" && n == maxStreams/2+maxStreams/4 {
				break
			}
			dial(streamHeader(1))
			held = append(held, accepted())
		}
	}
	if c := dial(streamHeader(1)); !hungUp(t, c) {
		t.Fatalf("stream %d of at most %d was not closed", maxStreams+1, maxStreams)
	}
	for _, c := range held {
		c.Close()
	}
	if open, declared := charged(); open != 0 || declared != 0 {
		t.Fatalf("%d streams and %d bytes still charged after every stream closed", open, declared)
	}
}
