package httpapi

import (
	"bufio"
	"io"
	"net"
	"time"
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

// sendChunk is the most a response writes under one write deadline. A
// response fails when the client takes nothing for the idle timeout, not
// after a total time, so the deadline moves on between chunks: a client
// taking at least sendChunk per idle timeout (35 KB/s at 30 s) is served
// whole, however long that takes. Larger chunks would demand more of a slow
// link; smaller ones cost a writev each.
const sendChunk = 1 << 20

// gatherListener wraps accepted connections in gatherConn (whose chunks
// keep every response's write deadline) and sizes the TCP ones' send
// buffers.
type gatherListener struct {
	net.Listener
	sendBuffer int
	idle       time.Duration // the write deadline after each chunk's start; 0: none
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
	if tc, isTCP := raw.(*net.TCPConn); isTCP && l.sendBuffer > 0 {
		// Best effort: a refused size leaves the kernel's autotuning.
		_ = tc.SetWriteBuffer(l.sendBuffer)
	}
	return &gatherConn{Conn: raw, closer: closer, idle: l.idle}, nil
}

// gatherConn lets a large body leave in the same writev(2) as the response
// headers fasthttp has buffered: on loopback every extra send is a full trip
// through both TCP stacks (measured: 7 µs of ~40 per 110 KiB response).
// fasthttp serves one request at a time per connection, so no locking.
type gatherConn struct {
	net.Conn           // in a node a *net.TCPConn or *net.UnixConn (--socket), both writev-capable
	closer   io.Closer // when set, closes the connection instead of Conn
	hold     bool
	held     []byte
	// vec is reused for every writev, so a hit allocates nothing; sending
	// consumes out, a copy of it (a local copy would escape to the heap),
	// one run at a time (run, also reused, and sending, the copy of it that
	// WriteTo consumes).
	vec, out, run, sending net.Buffers
	idle                   time.Duration
	moved                  time.Time // when the write deadline was last set
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

// Write sends p in runs as writeBuffersAfter does, except the one write
// writeAfter asks to hold.
func (c *gatherConn) Write(p []byte) (int, error) {
	if c.hold {
		c.hold = false
		c.held = append(c.held[:0], p...)
		return len(p), nil
	}
	c.vec = append(c.vec[:0], p)
	c.out = c.vec
	n, err := c.send()
	clear(c.vec)
	clear(c.run)
	return int(n), err
}

// progress gives the next chunk at least the idle timeout from now.
// Setting a deadline costs more than reading the clock, so a deadline set
// less than idle/4 ago is kept, and each is set idle/4 beyond the idle
// timeout: a silent client is cut off between 1 and 5/4 idle timeouts
// after its last progress.
func (c *gatherConn) progress() {
	if c.idle <= 0 {
		return
	}
	now := time.Now()
	if now.Sub(c.moved) < c.idle/4 {
		return
	}
	c.moved = now
	_ = c.Conn.SetWriteDeadline(now.Add(c.idle + c.idle/4))
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
	n, err := c.send()
	// Hold no item memory past the response: WriteTo drops what it sent,
	// and a failed write leaves the rest of its run.
	clear(c.vec)
	clear(c.run)
	c.held = c.held[:0]
	return max(n-int64(head), 0), err
}

// send writes out in runs of at most sendChunk bytes, each under a
// deadline moved on by progress.
func (c *gatherConn) send() (int64, error) {
	var n int64
	for len(c.out) > 0 {
		c.run = c.run[:0]
		for size := 0; len(c.out) > 0 && size < sendChunk; {
			b := c.out[0]
			if left := sendChunk - size; len(b) > left {
				c.run = append(c.run, b[:left])
				c.out[0] = b[left:]
				break
			}
			c.run = append(c.run, b)
			size += len(b)
			c.out = c.out[1:]
		}
		c.progress()
		c.sending = c.run
		m, err := c.sending.WriteTo(c.Conn)
		n += m
		if err != nil {
			return n, err
		}
	}
	return n, nil
}
