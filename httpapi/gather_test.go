package httpapi

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

func sendBufferOf(t *testing.T, c net.Conn) int {
	t.Helper()
	rc, err := c.(*gatherConn).Conn.(syscall.Conn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var size int
	var serr error
	if err := rc.Control(func(fd uintptr) {
		size, serr = syscall.GetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF)
	}); err != nil || serr != nil {
		t.Fatal(err, serr)
	}
	return size
}

// acceptOne accepts one loopback connection through wrap.
func acceptOne(t *testing.T, wrap func(net.Listener) net.Listener) net.Conn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	sc, err := wrap(ln).Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sc.Close() })
	return sc
}

func withSendBuffer(n int) func(net.Listener) net.Listener {
	return func(ln net.Listener) net.Listener { return gatherListener{Listener: ln, sendBuffer: n} }
}

func TestAcceptedConnectionsGetTheSendBuffer(t *testing.T) {
	// Linux doubles the requested size to leave room for its bookkeeping.
	if got := sendBufferOf(t, acceptOne(t, withSendBuffer(96<<10))); got != 2*96<<10 {
		t.Fatalf("SO_SNDBUF = %d, want %d", got, 2*96<<10)
	}
	// 0 must leave the socket exactly as the kernel made it.
	plain := acceptOne(t, func(ln net.Listener) net.Listener { return ln })
	want := sendBufferOf(t, &gatherConn{Conn: plain})
	if got := sendBufferOf(t, acceptOne(t, withSendBuffer(0))); got != want {
		t.Fatalf("SO_SNDBUF = %d with sendBuffer 0, want the kernel default %d", got, want)
	}
}

// A plain Write (a streamed body through fasthttp's buffer, a checkpoint
// part) keeps the deadline moving too: 4 MiB taken 256 KiB at a time over
// several idle timeouts arrive whole, and a Write its reader stops taking
// fails with a timeout instead of blocking.
func TestWriteDeadlineMovesWithProgress(t *testing.T) {
	const idle = 200 * time.Millisecond
	server, client := net.Pipe() // no buffering: a write waits for its reader
	defer client.Close()
	c := &gatherConn{Conn: server, idle: idle}
	defer c.Close()
	body := bytes.Repeat([]byte("0123456789abcdef"), 4<<20/16)
	done := make(chan error, 1)
	go func() {
		_, err := c.Write(body)
		done <- err
	}()
	got := make([]byte, 0, len(body))
	piece := make([]byte, 256<<10)
	for len(got) < len(body) {
		time.Sleep(idle / 8) // 16 pieces: two idle timeouts in all
		n, err := io.ReadFull(client, piece)
		got = append(got, piece[:n]...)
		if err != nil {
			t.Fatalf("after %d bytes: %v", len(got), err)
		}
	}
	if err := <-done; err != nil || !bytes.Equal(got, body) {
		t.Fatalf("a slow but steady reader: %d of %d bytes, write error %v", len(got), len(body), err)
	}
	go func() {
		_, err := c.Write(body)
		done <- err
	}()
	if _, err := io.ReadFull(client, piece); err != nil {
		t.Fatal(err)
	}
	select { // the reader stops: the write ends on its own
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("a write nobody takes: %v, want a deadline error", err)
		}
	case <-time.After(20 * idle):
		t.Fatal("a write nobody takes still blocks after 20 idle timeouts")
	}
}
