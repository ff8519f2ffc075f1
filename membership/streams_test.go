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

// Gossip streams reach memberlist only within bounds: a stream whose header
// declares more than any cluster's state is closed before its body is
// read, and beyond maxStreams at once the next is closed until one ends.
// An admitted stream reads from its first byte, the header put back.
func TestGossipStreamsAreBounded(t *testing.T) {
	tr, err := newStreamTransport("127.0.0.1", 0, true, 5*time.Second, stdlog.New(io.Discard, "", 0), slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(tr.GetAutoBindPort()))
	dial := func(b []byte) net.Conn {
		t.Helper()
		c, err := net.Dial("tcp", addr)
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

	if c := dial(streamHeader(maxStreamBytes + 1)); !hungUp(t, c) {
		t.Fatal("a stream declaring more than maxStreamBytes was not closed")
	}
	body := append(streamHeader(3), "abc"...)
	dial(body)
	got := make([]byte, len(body))
	first := accepted()
	if _, err := io.ReadFull(first, got); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("an admitted stream read %q, %v; want %q", got, err, body)
	}
	held := []net.Conn{first}
	for range maxStreams - 1 {
		dial(streamHeader(maxStreamBytes))
		held = append(held, accepted())
	}
	if c := dial(streamHeader(1)); !hungUp(t, c) {
		t.Fatalf("stream %d of at most %d was not closed", maxStreams+1, maxStreams)
	}
	held[0].Close() // memberlist is done with one: room for one more
	dial(streamHeader(1))
	held = append(held, accepted())
	for _, c := range held {
		c.Close()
	}
}
