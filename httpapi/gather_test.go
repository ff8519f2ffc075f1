package httpapi

import (
	"bufio"
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
	// A broken writer fails the test instead of leaving its reader blocked.
	client.SetReadDeadline(time.Now().Add(20 * idle))
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

// A response's buffers (items' memory) are not kept past it, whether it
// was sent whole or its client went away halfway.
func TestSentBuffersAreNotKept(t *testing.T) {
	for _, taken := range []int64{-1, 3 << 19} { // all; 1.5 MiB, then the client closes
		server, client := net.Pipe()
		go func() {
			if taken < 0 {
				io.Copy(io.Discard, client)
			} else {
				io.CopyN(io.Discard, client, taken)
			}
			client.Close()
		}()
		c := &gatherConn{Conn: server, idle: time.Minute}
		var bufs [][]byte
		for range 40 { // 2.5 MiB: runs of 17, 17 and 8 pieces
			bufs = append(bufs, make([]byte, 64<<10))
		}
		bw := bufio.NewWriter(c)
		bw.WriteString("HTTP/1.1 200 OK\r\n\r\n")
		n, err := c.writeBuffersAfter(bw, bufs...)
		if (taken < 0) != (err == nil) || (taken < 0 && n != 40*64<<10) {
			t.Fatalf("client taking %d bytes: sent %d, %v", taken, n, err)
		}
		for name, kept := range map[string]net.Buffers{"vec": c.vec, "run": c.run} {
			for i, b := range kept[:cap(kept)] {
				if b != nil {
					t.Fatalf("client taking %d bytes: %s[%d] still refers to %d bytes after the response", taken, name, i, len(b))
				}
			}
		}
		c.Close()
	}
}
