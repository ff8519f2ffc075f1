package membership

import (
	"encoding/binary"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"

	"stallfree/logbridge"
)

// streamTransport is memberlist's own transport (UDP packets, a TCP
// connection per stream) with its streams bounded. memberlist reads an
// encrypted stream whole into memory before it checks the key: up to
// 20 MiB, on a goroutine per connection, with no bound on connections. So
// anyone who could reach the gossip port grew a node by gigabytes (200
// connections sending 20 MiB each took one to 5 GB). Here:
//   - at most maxStreams are open at once, at most half of them from one
//     address, so one party's connections cannot take every slot;
//   - with a key, a stream must send its header (the body's length) within
//     headerWait, or it is closed: a silent connection holds a slot for a
//     second, not memberlist's TCP timeout;
//   - a header may declare at most maxStreamBytes, and the streams open at
//     once at most streamBudget in all (half of it from one address), which
//     bounds what memberlist buffers.
//
// What is refused is closed at once; its sender tries again on its next
// round (a join by the rejoin loop).
type streamTransport struct {
	*memberlist.NetTransport
	streams   chan net.Conn
	encrypted bool
	log       *slog.Logger
	refusals  *logbridge.Limiter

	mu     sync.Mutex
	open   int               // streams open
	bytes  int64             // bytes their headers declared
	byAddr map[string]*usage // the same, per remote address

	// done closes at Shutdown: nothing more is handed to memberlist.
	// drained closes once the listener has stopped: admit ends.
	done, drained chan struct{}
	stopOnce      sync.Once
	wg            sync.WaitGroup
}

type usage struct {
	open  int
	bytes int64
}

const (
	// maxStreams bounds the gossip streams open at once: a push/pull every
	// few seconds per member, a join, a goodbye, a fallback ping.
	maxStreams = 32
	// maxStreamBytes bounds what an encrypted stream may declare: a push/pull
	// carries every member's state (a name, an address and this node's
	// metadata, ~100 bytes: ~200 bytes a member), so 2 MiB is about 10,000
	// members (more than 3,000 even at memberlist's 512-byte metadata bound).
	maxStreamBytes = 2 << 20
	// streamBudget bounds the bytes the open streams declared, together.
	// memberlist's buffer doubles as it reads, so it holds at most twice
	// this: 16 MiB (measured with scripts/gossip-flood.py: 200 connections
	// from 8 addresses declaring 2 MiB each, peak RSS 18 → 29 MB; 5 GB
	// before any bound).
	streamBudget = 8 << 20
	// headerWait is how long a stream may take to send its 5-byte header.
	headerWait = time.Second
	// encryptMsg is memberlist's message type of an encrypted stream: one
	// byte, then the body's length, 4 bytes big-endian.
	encryptMsg = 10
)

// newStreamTransport binds the gossip port (both UDP and TCP) at
// bind:port; libLog is memberlist's logger, log this node's.
func newStreamTransport(bind string, port int, encrypted bool, libLog *stdlog.Logger, log *slog.Logger) (*streamTransport, error) {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{bind}, BindPort: port, Logger: libLog})
	if err != nil {
		return nil, err
	}
	t := &streamTransport{NetTransport: nt, streams: make(chan net.Conn), encrypted: encrypted, log: log,
		refusals: logbridge.NewLimiter(logbridge.RefusalsEvery), byAddr: map[string]*usage{},
		done: make(chan struct{}), drained: make(chan struct{})}
	t.wg.Add(1)
	go t.admit()
	return t, nil
}

// StreamCh is where memberlist takes the streams admitted.
func (t *streamTransport) StreamCh() <-chan net.Conn { return t.streams }

// Shutdown stops the listeners, then admit: memberlist's listener blocks
// handing over a stream it accepted until someone takes it.
func (t *streamTransport) Shutdown() error {
	var err error
	t.stopOnce.Do(func() {
		close(t.done)
		err = t.NetTransport.Shutdown()
		close(t.drained)
		t.wg.Wait()
	})
	return err
}

func (t *streamTransport) admit() {
	defer t.wg.Done()
	for {
		select {
		case c := <-t.NetTransport.StreamCh():
			select {
			case <-t.done:
				c.Close()
				continue
			default:
			}
			addr := remoteHost(c)
			if !t.take(addr, 1, 0) {
				t.refuse(c, "too many gossip streams at once", "max", maxStreams)
				continue
			}
			t.wg.Add(1)
			go t.check(c, addr)
		case <-t.drained:
			return
		}
	}
}

// take charges streams (1, or 0 when only bytes are) and the bytes they
// declared to addr, within the bounds; false when they would be passed.
func (t *streamTransport) take(addr string, stream int, bytes int64) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	u := t.byAddr[addr]
	if u == nil {
		u = &usage{}
	}
	if t.open+stream > maxStreams || u.open+stream > maxStreams/2 ||
		t.bytes+bytes > streamBudget || u.bytes+bytes > streamBudget/2 {
		return false
	}
	t.open += stream
	u.open += stream
	t.bytes += bytes
	u.bytes += bytes
	t.byAddr[addr] = u
	return true
}

// give returns a stream's charge: the stream and its declared bytes.
func (t *streamTransport) give(addr string, bytes int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	u := t.byAddr[addr]
	t.open--
	u.open--
	t.bytes -= bytes
	u.bytes -= bytes
	if u.open == 0 {
		delete(t.byAddr, addr)
	}
}

// check reads an encrypted stream's header and hands the stream on, its
// header put back, unless it is late, declares too much or the budget has
// no room for it. The charge is given back when memberlist closes it.
func (t *streamTransport) check(c net.Conn, addr string) {
	defer t.wg.Done()
	var declared int64
	if t.encrypted {
		var head [5]byte
		c.SetReadDeadline(time.Now().Add(headerWait))
		_, err := io.ReadFull(c, head[:])
		c.SetReadDeadline(time.Time{})
		if err != nil {
			t.give(addr, 0)
			t.refuse(c, "no stream header within a second", "err", err)
			return
		}
		// A stream that is not encrypted is memberlist's to refuse: it
		// reads no body for it.
		if head[0] == encryptMsg {
			declared = int64(binary.BigEndian.Uint32(head[1:]))
			if declared > maxStreamBytes || !t.take(addr, 0, declared) {
				t.give(addr, 0)
				t.refuse(c, "a gossip stream larger than the room for it", "bytes", declared, "max", maxStreamBytes)
				return
			}
		}
		c = &slotConn{Conn: c, head: head[:], free: func() { t.give(addr, declared) }}
	} else {
		c = &slotConn{Conn: c, free: func() { t.give(addr, 0) }}
	}
	select {
	case t.streams <- c:
	case <-t.done:
		c.Close()
	}
}

func (t *streamTransport) refuse(c net.Conn, why string, args ...any) {
	if ok, leftOut := t.refusals.Allow(); ok {
		t.log.Warn("gossip stream refused: "+why, append(args, "remote", c.RemoteAddr().String(), "left_out", leftOut)...)
	}
	c.Close()
}

// remoteHost is the address a connection came from, without its port.
func remoteHost(c net.Conn) string {
	host, _, err := net.SplitHostPort(c.RemoteAddr().String())
	if err != nil {
		return c.RemoteAddr().String()
	}
	return host
}

// slotConn is an admitted stream: it reads its header back first, and
// gives its charge back when closed.
type slotConn struct {
	net.Conn
	head []byte
	free func()
	once sync.Once
}

func (c *slotConn) Read(p []byte) (int, error) {
	if len(c.head) > 0 {
		n := copy(p, c.head)
		c.head = c.head[n:]
		return n, nil
	}
	return c.Conn.Read(p)
}

func (c *slotConn) Close() error {
	c.once.Do(c.free)
	return c.Conn.Close()
}
