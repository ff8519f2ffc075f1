package transport

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"

	"stallfree/bufpool"
	"stallfree/logbridge"
)

// Request is a decoded peer request.
type Request struct {
	Dataset        string
	DatasetVersion uint64
	Indices        []uint32
	Ring           uint64
	Handoff        bool
	// Push is set when the asker hands the items over: Data[j] is the item
	// of Indices[j] and Sums[j] its checksum, already verified. The handler
	// answers Found for the items it kept; Data holds them only until it
	// returns.
	Push bool
	Data [][]byte
	Sums []uint64
	// Inline is set on the first call for a request, made on the
	// connection's reader: the handler must answer from memory without
	// blocking or return ErrWouldBlock, and is then called again (Inline
	// unset) on a goroutine of its own.
	Inline bool
}

// ErrWouldBlock is a handler's answer to an Inline request it cannot serve
// from memory.
var ErrWouldBlock = errors.New("transport: would block")

// Item is one item of a response. Release, when set, is called once its bytes
// are on the wire (pinned store bytes are written without a copy).
type Item struct {
	Data    []byte
	Sum     uint64
	Found   bool
	Release func()
}

// Handler answers a request with one Item per index, in order.
type Handler func(ctx context.Context, req *Request) ([]Item, error)

// Per-connection bounds.
const (
	maxInFlightPerConn = 64
	idleTimeout        = 5 * time.Minute
	frameTimeout       = 30 * time.Second
)

// requestPayload is how many item bytes a request may carry: only pushes
// carry any.
func requestPayload(h *Header) uint64 {
	if h.Op == OpPush {
		return MaxPush
	}
	return 0
}

// Server accepts authenticated peer connections.
type Server struct {
	// Figures answers OpStats: this member's cache figures. Set it before
	// Serve; nil answers OpStats with an error. It must not block.
	Figures func() Figures

	key     []byte
	handler Handler
	log     *slog.Logger
	ln      net.Listener
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   map[net.Conn]struct{}
	pushed  bufpool.Pool // receive buffers of push requests
	// refusals keeps the line about a refused handshake to one per
	// interval: anyone who reaches the port can cause one at will.
	refusals *logbridge.Limiter
}

// NewServer returns a server; call Serve.
func NewServer(key []byte, h Handler, log *slog.Logger) *Server {
	ctx, cancel := context.WithCancel(context.Background())
	return &Server{key: key, handler: h, log: log, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{},
		refusals: logbridge.NewLimiter(logbridge.RefusalsEvery)}
}

// Serve accepts connections on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	s.ln = ln
	s.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			if s.ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go s.serveConn(c)
	}
}

// Close stops accepting, closes every connection and waits for handlers.
func (s *Server) Close() error {
	s.cancel()
	s.mu.Lock()
	if s.ln != nil {
		s.ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Server) serveConn(c net.Conn) {
	defer s.wg.Done()
	defer func() {
		c.Close()
		s.mu.Lock()
		delete(s.conns, c)
		s.mu.Unlock()
	}()
	if err := serverHandshake(c, s.key); err != nil {
		if ok, leftOut := s.refusals.Allow(); ok {
			s.log.Warn("peer connection refused", "remote", c.RemoteAddr().String(), "err", err, "left_out", leftOut)
		}
		return
	}
	br := bufio.NewReaderSize(c, 64<<10)
	bw := bufio.NewWriterSize(c, 64<<10)
	var wmu sync.Mutex
	sem := make(chan struct{}, maxInFlightPerConn)
	var inflight sync.WaitGroup
	defer inflight.Wait()
	for {
		c.SetReadDeadline(time.Now().Add(idleTimeout))
		// Only pushes carry a payload; any other declared payload is a
		// protocol error, refused before anything is allocated for it.
		h, payload, err := readFrameFor(br, requestPayload, &s.pushed)
		if err != nil {
			if !errors.Is(err, net.ErrClosed) && s.ctx.Err() == nil && !isEOF(err) {
				s.log.Warn("dropping peer connection", "remote", c.RemoteAddr().String(), "err", err)
			}
			return
		}
		if h.Op == OpStats {
			s.respondFigures(c, bw, &wmu, h)
			continue
		}
		req, err := s.request(h, payload)
		if err != nil {
			s.log.Warn("dropping peer connection: bad request", "remote", c.RemoteAddr().String(), "op", h.Op, "err", err)
			return
		}
		if req.Push && !pushIntact(req) {
			s.recycle(payload)
			s.respond(c, bw, &wmu, h, nil, errors.New("pushed item fails its checksum"))
			continue
		}
		// Items in memory are answered right here: a goroutine per request
		// costs more than serving it (most peer requests are such hits).
		if items, err := s.handler(s.ctx, req); !errors.Is(err, ErrWouldBlock) {
			s.recycle(payload)
			s.respond(c, bw, &wmu, h, items, err)
			continue
		}
		req.Inline = false
		select {
		case sem <- struct{}{}:
		case <-s.ctx.Done():
			return
		}
		inflight.Add(1)
		go func() {
			defer inflight.Done()
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(s.ctx, frameTimeout)
			defer cancel()
			items, err := s.handler(ctx, req)
			s.recycle(payload)
			s.respond(c, bw, &wmu, h, items, err)
		}()
	}
}

// recycle hands a push's receive buffer back (nil for other requests).
func (s *Server) recycle(payload *bufpool.Buf) {
	if payload != nil {
		s.pushed.Put(payload)
	}
}

// request checks a request frame's shape and splits a push's payload into
// its items. An error means the peer does not speak the protocol.
func (s *Server) request(h *Header, payload *bufpool.Buf) (*Request, error) {
	if len(h.Indices) == 0 {
		return nil, errors.New("no indices")
	}
	req := &Request{Dataset: h.Dataset, DatasetVersion: h.DatasetVersion, Indices: h.Indices, Ring: h.Ring,
		Handoff: h.Flags&FlagHandoff != 0, Inline: true}
	switch h.Op {
	case OpGet:
		return req, nil
	case OpPush:
	default:
		return nil, fmt.Errorf("unknown op %d", h.Op)
	}
	if req.Handoff || len(h.Sizes) != len(h.Indices) || len(h.Sums) != len(h.Indices) {
		return nil, errors.New("a push needs one size and one sum per index, and no handoff")
	}
	var b []byte
	if payload != nil {
		b = payload.B
	}
	total := len(b)
	req.Push, req.Sums, req.Data = true, h.Sums, make([][]byte, len(h.Sizes))
	for j, sz := range h.Sizes {
		if sz < 0 || sz > int64(len(b)) {
			return nil, fmt.Errorf("item sizes exceed the %d bytes pushed", total)
		}
		req.Data[j], b = b[:sz:sz], b[sz:]
	}
	if len(b) != 0 {
		return nil, fmt.Errorf("%d stray bytes pushed", len(b))
	}
	return req, nil
}

// pushIntact checks every pushed item against the sum it came with: what an
// owner keeps must be what storage held.
func pushIntact(req *Request) bool {
	for j, d := range req.Data {
		if xxhash.Sum64(d) != req.Sums[j] {
			return false
		}
	}
	return true
}

// respond writes the answer to request h and releases the items.
func (s *Server) respond(c net.Conn, bw *bufio.Writer, wmu *sync.Mutex, h *Header, items []Item, err error) {
	defer func() {
		for _, it := range items {
			if it.Release != nil {
				it.Release()
			}
		}
	}()
	resp := &Header{ID: h.ID, Op: h.Op}
	var payload [][]byte
	if err != nil || len(items) != len(h.Indices) {
		resp.Status = StatusError
		if err != nil {
			resp.Err = err.Error()
		} else {
			resp.Err = "handler returned the wrong number of items"
		}
	} else {
		resp.Sizes = make([]int64, len(items))
		resp.Sums = make([]uint64, len(items))
		for i, it := range items {
			if !it.Found {
				resp.Sizes[i] = -1
				continue
			}
			resp.Sizes[i] = int64(len(it.Data))
			resp.Sums[i] = it.Sum
			payload = append(payload, it.Data)
		}
	}
	wmu.Lock()
	defer wmu.Unlock()
	c.SetWriteDeadline(time.Now().Add(frameTimeout))
	if err := writeFrameTo(c, bw, resp, payload); err != nil {
		c.Close() // the reader loop sees the close and ends the connection
	}
}

// respondFigures answers an OpStats request with this member's figures.
func (s *Server) respondFigures(c net.Conn, bw *bufio.Writer, wmu *sync.Mutex, h *Header) {
	resp := &Header{ID: h.ID, Op: h.Op}
	var payload [][]byte
	if s.Figures == nil {
		resp.Status, resp.Err = StatusError, "this member keeps no figures"
	} else if b, err := msgpack.Marshal(s.Figures()); err != nil {
		resp.Status, resp.Err = StatusError, err.Error()
	} else {
		payload = [][]byte{b}
	}
	wmu.Lock()
	defer wmu.Unlock()
	c.SetWriteDeadline(time.Now().Add(frameTimeout))
	if err := writeFrameTo(c, bw, resp, payload); err != nil {
		c.Close()
	}
}

func isEOF(err error) bool {
	var ne net.Error
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || (errors.As(err, &ne) && ne.Timeout())
}
