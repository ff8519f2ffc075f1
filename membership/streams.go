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
// connections sending 20 MiB each took one to 5 GB; 147 MB with 16 streams
// of 4 MiB at most, 39 MB with 8 of 2 MiB). Here at most
// maxStreams are handed to memberlist at once (the others are closed at
// once), and with a key, one whose header declares more than maxStreamBytes
// is closed before memberlist reads its body.
type streamTransport struct {
	*memberlist.NetTransport
	streams   chan net.Conn
	slots     chan struct{}
	encrypted bool
	timeout   time.Duration // to read a stream's header
	log       *slog.Logger
	refusals  *logbridge.Limiter
	// done closes at Shutdown: nothing more is handed to memberlist.
	// drained closes once the listener has stopped: admit ends.
	done, drained chan struct{}
	stopOnce      sync.Once
	wg            sync.WaitGroup
}

const (
	// maxStreams bounds the gossip streams memberlist handles at once: a
	// push/pull every few seconds per member, a join, a goodbye. Ones
	// beyond it are refused and tried again on the peer's next round (a
	// join by the rejoin loop). With memberlist's buffer doubling as it
	// reads, what they hold is at most 2×maxStreamBytes each: 32 MiB.
	maxStreams = 8
	// maxStreamBytes bounds what an encrypted stream may declare: a push/pull
	// carries every member's state (a name, an address and this node's
	// metadata, ~100 bytes: ~200 bytes a member), so 2 MiB is about 10,000
	// members (more than 3,000 even at memberlist's 512-byte metadata bound).
	maxStreamBytes = 2 << 20
	// encryptMsg is memberlist's message type of an encrypted stream: one
	// byte, then the body's length, 4 bytes big-endian.
	encryptMsg = 10
)

// newStreamTransport binds the gossip port (both UDP and TCP) at
// bind:port; libLog is memberlist's logger, log this node's.
func newStreamTransport(bind string, port int, encrypted bool, timeout time.Duration, libLog *stdlog.Logger, log *slog.Logger) (*streamTransport, error) {
	nt, err := memberlist.NewNetTransport(&memberlist.NetTransportConfig{BindAddrs: []string{bind}, BindPort: port, Logger: libLog})
	if err != nil {
		return nil, err
	}
	t := &streamTransport{NetTransport: nt, streams: make(chan net.Conn), slots: make(chan struct{}, maxStreams),
		encrypted: encrypted, timeout: timeout, log: log, refusals: logbridge.NewLimiter(logbridge.RefusalsEvery),
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
			select {
			case t.slots <- struct{}{}:
				t.wg.Add(1)
				go t.check(c)
			default:
				t.refuse(c, "too many gossip streams at once", "max", maxStreams)
			}
		case <-t.drained:
			return
		}
	}
}

// check reads an encrypted stream's header and hands the stream on, its
// header put back, unless it declares more than maxStreamBytes. The slot
// is given back when memberlist closes the stream.
func (t *streamTransport) check(c net.Conn) {
	defer t.wg.Done()
	s := &slotConn{Conn: c, free: func() { <-t.slots }}
	if t.encrypted {
		var head [5]byte
		c.SetReadDeadline(time.Now().Add(t.timeout))
		n, err := io.ReadFull(c, head[:])
		c.SetReadDeadline(time.Time{})
		s.head = head[:n]
		if err == nil && head[0] == encryptMsg {
			if size := binary.BigEndian.Uint32(head[1:]); size > maxStreamBytes {
				t.refuse(s, "a gossip stream larger than any cluster's state", "bytes", size, "max", maxStreamBytes)
				return
			}
		}
		// A short or unencrypted header is memberlist's to refuse: it
		// reads no body for it.
	}
	select {
	case t.streams <- s:
	case <-t.done:
		s.Close()
	}
}

func (t *streamTransport) refuse(c net.Conn, why string, args ...any) {
	if ok, leftOut := t.refusals.Allow(); ok {
		t.log.Warn("gossip stream refused: "+why, append(args, "remote", c.RemoteAddr().String(), "left_out", leftOut)...)
	}
	c.Close()
}

// slotConn is an admitted stream: it reads its header back first, and
// frees its slot when closed.
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
