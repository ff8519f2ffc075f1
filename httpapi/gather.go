package httpapi

import (
	"bufio"
	"io"
	"net"
)

// gatherMin is the item size from which headers and body are sent with one
// writev: below it, copying the body into fasthttp's buffer is cheaper.
const gatherMin = 8 << 10

// DefaultSendBuffer is the kernel send buffer (SO_SNDBUF) of each client
// connection. Left to autotuning, a connection streaming a 7 MB batch queues
// up to tcp_wmem's 4 MiB, and with 16 such connections the receiver copies
// out bytes that left the CPU caches long ago: `sfbench -only
// stallfree-local,stallfree-batch64` measured 36-42k batch items/s with
// autotuning or 1-2 MiB, 49k with 256 KiB, 51-58k with 512 KiB (the kernel
// doubles it), and no change for single items; bench's
// BenchmarkBatchSendBuffer shows the same without a node. Links whose bandwidth-delay
// product exceeds ~1 MiB want more (or 0: autotuning).
const DefaultSendBuffer = 512 << 10

// gatherListener wraps accepted TCP and Unix connections in gatherConn and
// sizes the TCP ones' send buffers.
type gatherListener struct {
	net.Listener
	sendBuffer int
}

func (l gatherListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	var closer io.Closer // the guarded conn, which counts its close
	raw := c
	if u, isWrapped := c.(interface{ Unwrap() net.Conn }); isWrapped {
		raw, closer = u.Unwrap(), c
	}
	switch rc := raw.(type) {
	case *net.TCPConn:
		if l.sendBuffer > 0 {
			// Best effort: a refused size leaves the kernel's autotuning.
			_ = rc.SetWriteBuffer(l.sendBuffer)
		}
	case *net.UnixConn: // the --socket listener: writev works there too
	default:
		return c, nil
	}
	return &gatherConn{Conn: raw, closer: closer}, nil
}

// gatherConn lets a large body leave in the same writev(2) as the response
// headers fasthttp has buffered: on loopback every extra send is a full trip
// through both TCP stacks (measured: 7 µs of ~40 per 110 KiB response).
// fasthttp serves one request at a time per connection, so no locking.
type gatherConn struct {
	net.Conn           // a *net.TCPConn or *net.UnixConn, both writev-capable
	closer   io.Closer // when set, closes the connection instead of Conn
	hold     bool
	held     []byte
	// vec is reused for every writev, so a hit allocates nothing; sending
	// consumes out, a copy of it (a local copy would escape to the heap).
	vec, out net.Buffers
}

// Close closes the connection through the listener's guard, if any.
// Unwrap is the socket itself (handoff.PeerPID asks it who is at the other
// end).
func (c *gatherConn) Unwrap() net.Conn { return c.Conn }

func (c *gatherConn) Close() error {
	if c.closer != nil {
		return c.closer.Close()
	}
	return c.Conn.Close()
}

// Write passes through, except the one write writeAfter asks to hold.
func (c *gatherConn) Write(p []byte) (int, error) {
	if c.hold {
		c.hold = false
		c.held = append(c.held[:0], p...)
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// writeAfter sends what bw holds followed by body in one writev and returns
// the body bytes written.
func (c *gatherConn) writeAfter(bw *bufio.Writer, body []byte) (int64, error) {
	return c.writeBuffersAfter(bw, body)
}

// writeBuffersAfter sends what bw holds followed by bufs in one writev (the
// kernel takes up to 1024 pieces a call; net.Buffers loops beyond that).
func (c *gatherConn) writeBuffersAfter(bw *bufio.Writer, bufs ...[]byte) (int64, error) {
	c.hold = true
	err := bw.Flush() // lands in Write above, held
	c.hold = false
	if err != nil {
		return 0, err
	}
	head := len(c.held)
	c.vec = append(append(c.vec[:0], c.held), bufs...)
	c.out = c.vec
	n, err := c.out.WriteTo(c.Conn)
	clear(c.vec) // hold no item memory past the response
	c.held = c.held[:0]
	return max(n-int64(head), 0), err
}
