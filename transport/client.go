package transport

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"

	"stallfree/bufpool"
)

// ErrClosed means the connection failed while a request was pending.
var ErrClosed = errors.New("transport: connection closed")

// connsPerPeer spreads load over a few TCP streams per peer.
const connsPerPeer = 2

// DialTimeout bounds connecting plus the handshake. The kernel sends a SYN
// again after 1 s, so a bound of 1 s failed every dial whose first SYN was
// lost, and the fetch behind it read storage; 3 s outlasts one resend. A
// caller's context (a fetch's PeerTimeout) bounds it anyway.
const DialTimeout = 3 * time.Second

// Result is one fetched item.
type Result struct {
	Data  []byte
	Sum   uint64
	Found bool
	// buf is set when Data is the whole of a pooled buffer this result owns.
	buf  *bufpool.Buf
	pool *bufpool.Pool
}

// Recycle hands the bytes of a single-item fetch back for reuse by later
// fetches; Data must not be used afterwards. Calling it is optional (an
// unrecycled buffer is simply collected) and it does nothing the second time.
func (r *Result) Recycle() {
	if r.buf != nil {
		r.pool.Put(r.buf)
		r.buf, r.Data = nil, nil
	}
}

// Client fetches items from peers over pooled, multiplexed connections.
type Client struct {
	key   []byte
	mu    sync.Mutex
	peers map[string][]*conn
	// dialing holds a channel per address with a dial under way, closed
	// when it ends: one dial per peer at a time. A burst of requests to a
	// peer without connections (every peer, when an epoch starts on 32
	// nodes) would otherwise send a SYN and a handshake per request.
	dialing map[string]chan struct{}
	next    atomic.Uint64
	closed  bool
	bufs    bufpool.Pool
}

// NewClient returns a client that authenticates with key.
func NewClient(key []byte) *Client {
	return &Client{key: key, peers: map[string][]*conn{}, dialing: map[string]chan struct{}{}}
}

// Close closes every pooled connection.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	for addr, cs := range c.peers {
		for _, cn := range cs {
			cn.fail(ErrClosed)
		}
		delete(c.peers, addr)
	}
}

// Forget drops the pooled connections to addr (a dead or replaced peer).
func (c *Client) Forget(addr string) {
	c.mu.Lock()
	cs := c.peers[addr]
	delete(c.peers, addr)
	c.mu.Unlock()
	for _, cn := range cs {
		cn.fail(ErrClosed)
	}
}

// Get sends req to the peer at addr and returns one Result per index. Each
// item's bytes are checked against the checksum the peer sent. The result of
// a single-index request may be recycled (Result.Recycle).
func (c *Client) Get(ctx context.Context, addr string, req *Request) ([]Result, error) {
	if len(req.Indices) == 0 || len(req.Indices) > MaxItems {
		return nil, fmt.Errorf("transport: %d indices per request (1..%d)", len(req.Indices), MaxItems)
	}
	cn, err := c.conn(ctx, addr)
	if err != nil {
		return nil, err
	}
	h := &Header{Op: OpGet, Dataset: req.Dataset, DatasetVersion: req.DatasetVersion, Indices: req.Indices, Ring: req.Ring}
	if req.Handoff {
		h.Flags |= FlagHandoff
	}
	resp, pb, err := cn.roundTrip(ctx, h, nil)
	if err != nil {
		return nil, err
	}
	var payload []byte
	if pb != nil {
		payload = pb.B
	}
	if resp.Status != StatusOK {
		return nil, fmt.Errorf("transport: peer %s: %s", addr, resp.Err)
	}
	if len(resp.Sizes) != len(req.Indices) || len(resp.Sums) != len(req.Indices) {
		cn.fail(ErrFrame)
		return nil, fmt.Errorf("%w: %d sizes for %d indices", ErrFrame, len(resp.Sizes), len(req.Indices))
	}
	out := make([]Result, len(req.Indices))
	off := int64(0)
	for i, sz := range resp.Sizes {
		if sz < 0 {
			continue
		}
		if off+sz > int64(len(payload)) {
			cn.fail(ErrFrame)
			return nil, fmt.Errorf("%w: sizes exceed payload", ErrFrame)
		}
		data := payload[off : off+sz : off+sz]
		off += sz
		if xxhash.Sum64(data) != resp.Sums[i] {
			return nil, fmt.Errorf("transport: item %d from %s fails its checksum", req.Indices[i], addr)
		}
		out[i] = Result{Data: data, Sum: resp.Sums[i], Found: true}
	}
	if off != int64(len(payload)) {
		cn.fail(ErrFrame)
		return nil, fmt.Errorf("%w: %d stray payload bytes", ErrFrame, int64(len(payload))-off)
	}
	if len(out) == 1 && out[0].Found {
		out[0].buf, out[0].pool = pb, &c.bufs
	}
	return out, nil
}

// Push hands items to the peer at addr, their owner: req.Data[j] is the item
// of req.Indices[j], and req.Sums is filled here. kept[j] tells whether the
// peer now holds item j (false: it does not own it, or its memory is full).
func (c *Client) Push(ctx context.Context, addr string, req *Request) (kept []bool, err error) {
	if len(req.Indices) == 0 || len(req.Indices) > MaxItems || len(req.Data) != len(req.Indices) {
		return nil, fmt.Errorf("transport: push of %d items for %d indices (1..%d)", len(req.Data), len(req.Indices), MaxItems)
	}
	h := &Header{Op: OpPush, Dataset: req.Dataset, DatasetVersion: req.DatasetVersion, Indices: req.Indices, Ring: req.Ring,
		Sizes: make([]int64, len(req.Data)), Sums: make([]uint64, len(req.Data))}
	var total int
	for j, d := range req.Data {
		h.Sizes[j], h.Sums[j] = int64(len(d)), xxhash.Sum64(d)
		total += len(d)
	}
	if total > MaxPush {
		return nil, fmt.Errorf("transport: push of %d bytes exceeds %d", total, MaxPush)
	}
	req.Sums = h.Sums
	cn, err := c.conn(ctx, addr)
	if err != nil {
		return nil, err
	}
	resp, pb, err := cn.roundTrip(ctx, h, req.Data)
	if err != nil {
		return nil, err
	}
	if pb != nil {
		cn.fail(ErrFrame)
		return nil, fmt.Errorf("%w: a push answered with item bytes", ErrFrame)
	}
	if resp.Status != StatusOK {
		return nil, fmt.Errorf("transport: peer %s: %s", addr, resp.Err)
	}
	if len(resp.Sizes) != len(req.Indices) {
		cn.fail(ErrFrame)
		return nil, fmt.Errorf("%w: %d sizes for %d indices", ErrFrame, len(resp.Sizes), len(req.Indices))
	}
	kept = make([]bool, len(resp.Sizes))
	for j, sz := range resp.Sizes {
		kept[j] = sz >= 0
	}
	return kept, nil
}

// Figures asks the member at addr for its cache figures (OpStats).
func (c *Client) Figures(ctx context.Context, addr string) (Figures, error) {
	cn, err := c.conn(ctx, addr)
	if err != nil {
		return Figures{}, err
	}
	resp, pb, err := cn.roundTrip(ctx, &Header{Op: OpStats}, nil)
	if err != nil {
		return Figures{}, err
	}
	var payload []byte
	if pb != nil {
		defer c.bufs.Put(pb)
		payload = pb.B
	}
	if resp.Status != StatusOK {
		return Figures{}, fmt.Errorf("transport: peer %s: %s", addr, resp.Err)
	}
	var f Figures
	if len(payload) == 0 || len(payload) > maxFigures {
		cn.fail(ErrFrame)
		return Figures{}, fmt.Errorf("%w: figures of %d bytes", ErrFrame, len(payload))
	}
	if err := msgpack.Unmarshal(payload, &f); err != nil {
		return Figures{}, fmt.Errorf("%w: figures: %v", ErrFrame, err)
	}
	return f, nil
}

// Ping proves that the process behind addr is running and holds the key.
// It opens a connection of its own, outside the pool: the handshake needs
// the peer to answer, which a pooled connection (or a listening socket, whose
// backlog completes TCP's handshake even for a stopped process) does not.
func (c *Client) Ping(ctx context.Context, addr string) error {
	nc, err := connect(ctx, addr, c.key)
	if err != nil {
		return err
	}
	return nc.Close()
}

// connect dials addr and proves the key, both within ctx. The handshake sets
// a deadline of its own, so closing the connection is what holds it to ctx.
func connect(ctx context.Context, addr string, key []byte) (net.Conn, error) {
	d := net.Dialer{Timeout: DialTimeout}
	nc, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("transport: dial %s: %w", addr, err)
	}
	stop := context.AfterFunc(ctx, func() { nc.Close() })
	err = clientHandshake(nc, key)
	if !stop() || err != nil {
		nc.Close()
		if ctx.Err() != nil {
			err = ctx.Err() // the close above (or ctx's) is what ended the handshake
		}
		return nil, fmt.Errorf("transport: %s: %w", addr, err)
	}
	return nc, nil
}

func (c *Client) conn(ctx context.Context, addr string) (*conn, error) {
	for {
		c.mu.Lock()
		if c.closed {
			c.mu.Unlock()
			return nil, ErrClosed
		}
		cs := c.peers[addr]
		live := cs[:0]
		for _, cn := range cs {
			if !cn.dead.Load() {
				live = append(live, cn)
			}
		}
		c.peers[addr] = live
		wait, dialing := c.dialing[addr]
		if len(live) >= connsPerPeer || (dialing && len(live) > 0) {
			cn := live[c.next.Add(1)%uint64(len(live))]
			c.mu.Unlock()
			return cn, nil
		}
		if dialing {
			// Nothing to use yet: wait for the dial under way, then look again.
			c.mu.Unlock()
			select {
			case <-wait:
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		done := make(chan struct{})
		c.dialing[addr] = done
		c.mu.Unlock()

		cn, err := dial(ctx, addr, c.key, &c.bufs)
		c.mu.Lock()
		delete(c.dialing, addr)
		close(done)
		if err == nil && c.closed {
			cn.fail(ErrClosed)
			err = ErrClosed
		}
		if err == nil {
			c.peers[addr] = append(c.peers[addr], cn)
		}
		c.mu.Unlock()
		return cn, err
	}
}

type response struct {
	h       *Header
	payload *bufpool.Buf
	err     error
}

// conn is one multiplexed connection: writers take wmu, a single reader
// goroutine routes responses to waiters by request id.
type conn struct {
	nc      net.Conn
	bw      *bufio.Writer
	wmu     sync.Mutex
	mu      sync.Mutex
	pending map[uint64]chan response
	nextID  uint64
	dead    atomic.Bool
	err     error
	bufs    *bufpool.Pool
}

func dial(ctx context.Context, addr string, key []byte, bufs *bufpool.Pool) (*conn, error) {
	dctx, cancel := context.WithTimeout(ctx, DialTimeout+handshakeTTL)
	defer cancel()
	nc, err := connect(dctx, addr, key)
	if err != nil {
		return nil, err
	}
	cn := &conn{nc: nc, bw: bufio.NewWriterSize(nc, 64<<10), pending: map[uint64]chan response{}, bufs: bufs}
	// A small read buffer: payload bytes beyond it go straight from the
	// socket into the payload buffer instead of being copied through it.
	go cn.readLoop(bufio.NewReaderSize(nc, 4<<10))
	return cn, nil
}

func (cn *conn) readLoop(br *bufio.Reader) {
	for {
		h, payload, err := readFrame(br, MaxPayload, cn.bufs)
		if err != nil {
			cn.fail(err)
			return
		}
		cn.mu.Lock()
		ch, ok := cn.pending[h.ID]
		delete(cn.pending, h.ID)
		cn.mu.Unlock()
		if ok {
			ch <- response{h: h, payload: payload}
		}
	}
}

func (cn *conn) fail(err error) {
	cn.mu.Lock()
	if cn.dead.Swap(true) {
		cn.mu.Unlock()
		return
	}
	cn.err = err
	pend := cn.pending
	cn.pending = map[uint64]chan response{}
	cn.mu.Unlock()
	cn.nc.Close()
	for _, ch := range pend {
		ch <- response{err: fmt.Errorf("%w: %w", ErrClosed, err)}
	}
}

func (cn *conn) roundTrip(ctx context.Context, h *Header, payload [][]byte) (*Header, *bufpool.Buf, error) {
	ch := make(chan response, 1)
	cn.mu.Lock()
	if cn.dead.Load() {
		err := cn.err
		cn.mu.Unlock()
		return nil, nil, fmt.Errorf("%w: %w", ErrClosed, err)
	}
	cn.nextID++
	h.ID = cn.nextID
	cn.pending[h.ID] = ch
	cn.mu.Unlock()

	cn.wmu.Lock()
	dl, ok := ctx.Deadline()
	if !ok {
		dl = time.Now().Add(frameTimeout)
	}
	cn.nc.SetWriteDeadline(dl)
	err := writeFrameTo(cn.nc, cn.bw, h, payload)
	cn.wmu.Unlock()
	if err != nil {
		cn.fail(err)
		return nil, nil, fmt.Errorf("transport: send: %w", err)
	}
	select {
	case r := <-ch:
		return r.h, r.payload, r.err
	case <-ctx.Done():
		// A peer that does not answer in time may be hung (paused, half-open
		// TCP): drop the connection so later requests dial afresh rather than
		// queue behind it.
		cn.fail(ctx.Err())
		return nil, nil, fmt.Errorf("transport: waiting for peer: %w", ctx.Err())
	}
}
