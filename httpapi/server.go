// Package httpapi serves the public HTTP API (docs/api.md) with fasthttp. It
// is thin: a route table (routes.go) sends each request to a handler that
// holds the narrow interface it uses; handlers parse paths and bodies, call,
// map errors to status codes in one function (fail) and put bytes on the
// wire. Every rule about the catalog lives in package control, every rule
// about the items in package node.
package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
	"golang.org/x/sync/semaphore"

	"stallfree/api"
	"stallfree/bufpool"
	"stallfree/catalog"
	"stallfree/clusterauth"
	"stallfree/control"
	"stallfree/groups"
	"stallfree/listen"
	"stallfree/node"
	"stallfree/relay"
	"stallfree/source"
)

// MaxBodySize bounds request bodies (batch requests, registrations); larger
// ones get 413 before the handler runs.
const MaxBodySize = 1 << 20

// Server is the HTTP front of one node.
type Server struct {
	prep    prep // derived.go
	token   []byte
	log     *slog.Logger
	srv     *fasthttp.Server
	router  *router
	metrics fasthttp.RequestHandler
	readers sync.Pool
	// bodyBufs are the recycled bodies of routes that keep nothing of them
	// (route.recycle): a prep cache's first epoch writes a minibatch of
	// arrays per request, and a fresh buffer for each (12 MiB for 64 of
	// 256×256×3) is memory the kernel must fault in and zero again.
	bodyBufs bufpool.Pool
	// SendBuffer is each client connection's SO_SNDBUF in bytes (0: kernel
	// autotuning); set it before Serve. New sets DefaultSendBuffer.
	SendBuffer int
	// MaxConns bounds the client connections open at once; beyond it a new
	// one gets 503 and is closed (0: no bound). Set it before Serve.
	MaxConns int
	// IdleTimeout is --idle-timeout: a request whose headers or body make
	// no progress for this long is cut off, and so is a response its client
	// stops taking (a body's total time is not bounded, either way). Set it
	// before Serve. New sets DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxGroupWaits bounds the group reads waiting (?wait=) on this node at
	// once, its own and those it relays; past it: 503 with Retry-After.
	// Set it before Serve. New sets DefaultMaxGroupWaits.
	MaxGroupWaits int
	waiting       *semaphore.Weighted
	// MaxBodyBytes bounds the bytes of request bodies being read whole at
	// once, over all connections (--max-body-bytes): a body is charged its
	// Content-Length (its route's limit when chunked; on a recycle route the
	// recycled buffer's size) before a byte of it
	// is read, and given back when its handler returns; past the bound,
	// 503 with Retry-After. Without it, a few token holders sending large
	// bodies slowly made a node hold gigabytes. A body a route allows but
	// that is larger than the bound is read alone (it is charged the whole
	// bound). Set it before Serve (0: DefaultMaxBodyBytes).
	MaxBodyBytes int64
	bodies       *semaphore.Weighted
	bodyBytes    atomic.Int64    // charged to bodies now (a gauge)
	settle       sync.Once       // Serve applies the settings above once
	ckpt         Checkpoints     // checkpoints.go
	groups       *groups.Service // coordinated prep (groups.go); nil: off
	peers        *relay.Client   // the node's client to the other nodes: a group's batches are its owner's
	relay        Relay           // this node's applied index, on relayed group requests
	// memberKey checks members' proofs on the internal routes (member),
	// and liveMember whether the prover is a member gossip sees alive.
	memberKey  []byte
	liveMember func(name string) bool
}

// New builds the server; token may be empty (no auth).
func New(n *node.Node, token string, log *slog.Logger) *Server {
	s := &Server{prep: n.Prep(), token: []byte(token), log: log, SendBuffer: DefaultSendBuffer, IdleTimeout: DefaultIdleTimeout,
		MaxGroupWaits: DefaultMaxGroupWaits,
		memberKey:     n.MemberKey(), liveMember: func(name string) bool { return slices.Contains(n.MemberView().Members(), name) }}
	s.metrics = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(n.Registry(), promhttp.HandlerOpts{}))
	// One server per node; a second one (tests) keeps the first's gauge.
	n.Registry().Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "stallfree_http_body_bytes",
		Help: "Bytes of request bodies being read whole now, charged against --max-body-bytes."},
		func() float64 { return float64(s.bodyBytes.Load()) }))
	s.readers.New = func() any { return &itemReader{} }
	s.bodyBufs.Max = MaxWriteBatchBytes // a batch write's body; larger ones are rare enough to allocate
	s.relay, s.peers = n.Control(), n.Control().Relay()
	s.router = newRouter(s.routes(n))
	s.srv = &fasthttp.Server{
		Handler:           s.recovering(s.handle),
		StreamRequestBody: true,
		ErrorHandler:      s.parseError,
		Name:              "stallfree",
		ReadTimeout:       30 * time.Second,
		// No WriteTimeout: a response's deadline moves with its progress
		// (gatherConn.progress), as a request body's does; a total time
		// would cut off a large checkpoint part on a slow link.
		IdleTimeout:        2 * time.Minute,
		MaxRequestBodySize: MaxBodySize,
		// A multipart body would be read (into memory and temporary files)
		// before the handler, so before the token is checked; no route
		// takes one.
		DisablePreParseMultipartForm: true,
		// "Expect: 100-continue" is answered only once the token is
		// checked: the body is not invited from a caller without it.
		ExpectHandler: s.expectBody,
		NoDefaultDate: true,
		Logger:        fasthttpLogger{r: redactor{token: []byte(token)}, log: log},
	}
	return s
}

// DefaultMaxBodyBytes is MaxBodyBytes' default.
const DefaultMaxBodyBytes = 512 << 20

// DefaultMaxGroupWaits is MaxGroupWaits' default.
const DefaultMaxGroupWaits = 1024

// DefaultIdleTimeout is --idle-timeout's default.
const DefaultIdleTimeout = 30 * time.Second

// Serve serves on ln until Shutdown; a node serves its TCP port and its
// Unix socket, each with a Serve of its own, on one Server.
func (s *Server) Serve(ln net.Listener) error {
	s.settle.Do(func() { // the fields set before Serve, taken once
		if s.IdleTimeout > 0 {
			s.srv.ReadTimeout = s.IdleTimeout // the headers' (the body's: bodyStream)
		}
		s.waiting = semaphore.NewWeighted(int64(max(s.MaxGroupWaits, 1)))
		if s.MaxBodyBytes <= 0 {
			s.MaxBodyBytes = DefaultMaxBodyBytes
		}
		s.bodies = semaphore.NewWeighted(s.MaxBodyBytes)
	})
	guarded := listen.Guard(ln, listen.Options{Name: "http", MaxConns: s.MaxConns, Refuse: refuseConn, Log: s.log})
	return s.srv.Serve(gatherListener{Listener: guarded, sendBuffer: s.SendBuffer, idle: s.IdleTimeout})
}

// refuseConn answers a connection over MaxConns before closing it.
func refuseConn(c net.Conn) {
	const body = `{"error":"too many connections; retry"}`
	io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"+
		"Connection: close\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
}

// Shutdown stops accepting and waits for in-flight requests until ctx ends;
// the requests still open then (a peer's long wait, a client mid-body) have
// their connections closed when the process exits. It reports how many.
func (s *Server) Shutdown(ctx context.Context) (open int32, err error) {
	err = s.srv.ShutdownWithContext(ctx)
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		return s.srv.GetOpenConnectionsCount(), nil
	}
	return 0, err
}

func (s *Server) parseError(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", MaxBodySize))
		return
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		// Clients dial connections they may never use (Go's transport does).
		// A 400 written when such a connection times out would arrive as an
		// unsolicited response on the client's idle channel; just hang up.
		ctx.Conn().Close()
		return
	}
	if _, small := errors.AsType[*fasthttp.ErrSmallBuffer](err); small {
		writeError(ctx, fasthttp.StatusRequestHeaderFieldsTooLarge, "request headers too large")
		return
	}
	writeError(ctx, fasthttp.StatusBadRequest, "malformed request: "+redactor{token: s.token}.redact(err.Error()))
}

func writeError(ctx *fasthttp.RequestCtx, code int, msg string) {
	ctx.Response.Reset()
	ctx.SetStatusCode(code)
	ctx.SetContentType("application/json")
	b, _ := json.Marshal(map[string]string{"error": msg})
	ctx.SetBody(b)
}

func writeJSON(ctx *fasthttp.RequestCtx, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(ctx, fasthttp.StatusInternalServerError, err.Error())
		return
	}
	ctx.SetStatusCode(code)
	ctx.SetContentType("application/json")
	ctx.SetBody(b)
}

// writeCreated answers a PUT: 201 when it created v, 200 when v was there
// already (the same body again).
func writeCreated(ctx *fasthttp.RequestCtx, created bool, v any) {
	code := fasthttp.StatusOK
	if created {
		code = fasthttp.StatusCreated
	}
	writeJSON(ctx, code, v)
}

// status maps an error to the contract's status code (docs/api.md): the one
// place a domain error becomes a status. retry is set when the client should
// come back (Retry-After).
func status(err error) (code int, msg string, retry bool) {
	if e, ok := errors.AsType[*api.Error](err); ok {
		return e.Status, e.Message, e.Retry // relayed as the leader said it
	}
	if code, ok := derivedStatus(err); ok { // derived.go
		if errors.Is(err, catalog.ErrNotWritten) {
			return code, "not written", false // the contract's exact body
		}
		return code, err.Error(), false
	}
	switch {
	case errors.Is(err, node.ErrBusy):
		return fasthttp.StatusServiceUnavailable, err.Error(), true
	case errors.Is(err, catalog.ErrNotFound):
		code = fasthttp.StatusNotFound
	case errors.Is(err, catalog.ErrConflict):
		code = fasthttp.StatusConflict
	case errors.Is(err, catalog.ErrNoLeader), errors.Is(err, catalog.ErrNotLeader):
		code = fasthttp.StatusServiceUnavailable
	case errors.Is(err, control.ErrForbiddenSource), errors.Is(err, source.ErrDenied):
		code = fasthttp.StatusForbidden
	case errors.Is(err, source.ErrNotFound):
		code = fasthttp.StatusNotFound
	case errors.Is(err, source.ErrUnavailable):
		code = fasthttp.StatusBadGateway
	case errors.Is(err, control.ErrBadRequest), errors.Is(err, source.ErrBadKey):
		code = fasthttp.StatusBadRequest
	case errors.Is(err, source.ErrChanged):
		code = fasthttp.StatusBadGateway
	case errors.Is(err, node.ErrTooLarge):
		code = fasthttp.StatusRequestEntityTooLarge
	case errors.Is(err, source.ErrTimeout):
		code = fasthttp.StatusGatewayTimeout
	default:
		code = fasthttp.StatusInternalServerError
	}
	return code, err.Error(), false
}

// fail answers err with its status.
func fail(ctx *fasthttp.RequestCtx, err error) {
	code, msg, retry := status(err)
	writeError(ctx, code, msg)
	if retry {
		ctx.Response.Header.Set("Retry-After", "1") // writeError resets the response
	}
}

// recovering keeps a panicking handler from killing the process (fasthttp
// does not recover).
func (s *Server) recovering(h fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		defer func() {
			if r := recover(); r != nil {
				s.log.Error("handler panic", "path", string(ctx.URI().PathOriginal()), "panic", r, "stack", string(debug.Stack()))
				writeError(ctx, fasthttp.StatusInternalServerError, "internal error")
			}
		}()
		h(ctx)
	}
}

// handle routes a request. The token is checked first: before any body byte
// is read and before the route is resolved, so a caller without it can
// neither make the node buffer a body nor map the routes by their statuses
// (every path but the open probes answers it 401 alike). Names of datasets
// and jobs are checked before any handler sees them. Bodies arrive as
// streams: a stream route's handler reads its own, every other route's is
// read whole first, up to its limit.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	var segs [16]string
	path, seg := splitPath(ctx.URI().PathOriginal(), segs[:0])
	rt, p, allowed := s.router.match(string(ctx.Method()), path, seg)
	if (rt == nil || !rt.open) && !s.authorized(ctx) {
		writeError(ctx, fasthttp.StatusUnauthorized, "missing or wrong bearer token")
		ctx.Response.Header.Set("WWW-Authenticate", "Bearer") // writeError resets the response
		refuse(ctx, maxUnauthorizedDrain)
		return
	}
	switch {
	case rt == nil:
		// Whatever the body, the answer is the same: it is not read, only
		// drained (bounded) after the answer.
		defer drainRefused(ctx, maxTooLargeDrain)
		if allowed {
			writeError(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed")
		} else {
			writeError(ctx, fasthttp.StatusNotFound, "no such route")
		}
		return
	case !s.member(ctx, seg):
		writeError(ctx, fasthttp.StatusForbidden, "internal routes and requests marked as relayed serve members only (cluster key)")
		refuse(ctx, maxUnauthorizedDrain)
		return
	case rt.stream:
		s.handleStream(ctx, rt, p)
		return
	}
	limit := s.srv.MaxRequestBodySize
	if rt.limit != nil {
		limit = rt.limit()
	}
	var pool *bufpool.Pool
	if rt.recycle {
		pool = &s.bodyBufs
	}
	release, ok := s.readBody(ctx, limit, pool)
	if !ok {
		return
	}
	defer release()
	if err := p.decodeNames(); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	rt.handle(ctx, p)
}

// expectBody decides a request's "Expect: 100-continue" from its headers,
// as handle would: 100 (send the body) when the token and, for internal
// routes, the member's key hold; else 401 or 403, and fasthttp closes the
// connection without calling handle or reading a byte of the body.
func (s *Server) expectBody(ctx *fasthttp.RequestCtx) int {
	var segs [16]string
	path, seg := splitPath(ctx.URI().PathOriginal(), segs[:0])
	rt, _, _ := s.router.match(string(ctx.Method()), path, seg)
	switch {
	case (rt == nil || !rt.open) && !s.authorized(ctx):
		return fasthttp.StatusUnauthorized
	case rt != nil && !s.member(ctx, seg):
		return fasthttp.StatusForbidden
	}
	return fasthttp.StatusContinue
}

// maxUnauthorizedDrain bounds what is read of a request refused for its
// token: enough for a small body to be answered rather than reset, and no
// more, since nobody vouches for the sender.
const maxUnauthorizedDrain = 64 << 10

// drainRefused reads (and drops) the rest of a refused request's body, up to
// bound, so that a client still sending gets the answer and not a reset;
// past the bound the connection is closed.
func drainRefused(ctx *fasthttp.RequestCtx, bound int64) {
	if !ctx.Request.IsBodyStream() {
		return
	}
	if _, err := io.CopyN(io.Discard, ctx.RequestBodyStream(), bound); err != io.EOF {
		ctx.SetConnectionClose()
	}
}

// handleStream serves a stream route (the caller holds the token), whose
// body is still unread. A request refused before its handler (bad names)
// has up to 64 MiB of its body read and dropped, so a client still sending
// sees the status rather than a reset, and its connection is closed. An
// answer of 300 or more from the handler reads the rest of the body
// (bounded) first, for the same reason.
func (s *Server) handleStream(ctx *fasthttp.RequestCtx, rt *route, p params) {
	if err := p.decodeNames(); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		refuse(ctx, maxTooLargeDrain)
		return
	}
	defer func() {
		if ctx.Response.StatusCode() >= 300 {
			drainRefused(ctx, maxDrain)
		}
	}()
	rt.handle(ctx, p)
}

// refuse drops up to bound of a refused request's body, for at most
// refuseDrainTime, and closes its connection: nothing more of that body is
// read, and a sender that stops sending does not hold the answer back.
func refuse(ctx *fasthttp.RequestCtx, bound int64) {
	ctx.Conn().SetReadDeadline(time.Now().Add(refuseDrainTime))
	drainRefused(ctx, bound)
	ctx.SetConnectionClose()
}

// refuseDrainTime bounds how long a refused body is drained.
const refuseDrainTime = 200 * time.Millisecond

// member reports whether a request may use the route under seg. An
// internal route (/v1/internal/…) acts on this node's own copies, so it
// wants a member's proof (clusterauth.SignRequest) beside the token, which
// clients hold too, from a member gossip sees alive. A request marked as
// relayed by another node (api.HeaderForwarded) wants the proof too, on
// any route: the mark makes a node act on a request as a peer's (write an
// item it does not own, commit a checkpoint step without asking its
// owner), and a client could set it. A node that left still holds the key;
// a relay it sent on a client's behalf is no worse than that client's own
// request, so only the internal routes ask for a live member. Without a
// cluster key (loopback only) the token is all there is.
func (s *Server) member(ctx *fasthttp.RequestCtx, seg []string) bool {
	internal := len(seg) >= 2 && seg[0] == "v1" && seg[1] == "internal"
	if len(s.memberKey) == 0 || (!internal && !relayed(ctx)) {
		return true
	}
	from := string(ctx.Request.Header.Peek(api.HeaderForwarded))
	err := clusterauth.VerifyRequest(s.memberKey, string(ctx.Method()), string(ctx.RequestURI()),
		from, string(ctx.Request.Header.Peek(clusterauth.HeaderMember)), time.Now())
	if err == nil && internal && !s.liveMember(from) {
		// A node that left (or was removed) still holds the key: only the
		// members gossip sees alive may act on this node's copies.
		err = fmt.Errorf("%s is not a live member", from)
	}
	if err != nil {
		s.log.Warn("member's request refused", "path", string(ctx.Path()), "from", ctx.RemoteAddr().String(), "err", err)
		return false
	}
	return true
}

func (s *Server) authorized(ctx *fasthttp.RequestCtx) bool {
	if len(s.token) == 0 {
		return true
	}
	h := ctx.Request.Header.Peek("Authorization")
	const prefix = "Bearer "
	if len(h) <= len(prefix) || string(h[:len(prefix)]) != prefix {
		return false
	}
	return subtle.ConstantTimeCompare(h[len(prefix):], s.token) == 1
}

func methodNotAllowed(ctx *fasthttp.RequestCtx) {
	writeError(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed")
}

func decodeStrict(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("malformed JSON body: %w", err)
	}
	if dec.More() {
		return errors.New("malformed JSON body: trailing data")
	}
	return nil
}

// itemReader streams pinned store bytes into fasthttp's writer and unpins
// them when fasthttp closes it, after the last byte is written.
type itemReader struct {
	item node.Item
	off  int
	pool *sync.Pool
	conn *gatherConn
}

func (r *itemReader) Read(p []byte) (int, error) {
	if r.off >= len(r.item.Data) {
		return 0, io.EOF
	}
	n := copy(p, r.item.Data[r.off:])
	r.off += n
	return n, nil
}

// WriteTo hands the item to the socket. A large item goes out together with
// the response headers in one writev(2), straight from the store's memory:
// no copy into fasthttp's buffer and no separate packet for the headers.
func (r *itemReader) WriteTo(w io.Writer) (int64, error) {
	if bw, ok := w.(*bufio.Writer); ok && r.conn != nil && r.off == 0 && len(r.item.Data) >= gatherMin {
		n, err := r.conn.writeAfter(bw, r.item.Data)
		r.off += int(n)
		return n, err
	}
	n, err := w.Write(r.item.Data[r.off:])
	r.off += n
	return int64(n), err
}

func (r *itemReader) Close() error {
	r.item.Release()
	r.item, r.off, r.conn = node.Item{}, 0, nil
	r.pool.Put(r)
	return nil
}
