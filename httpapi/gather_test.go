package httpapi

import (
	"net"
	"syscall"
	"testing"
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
