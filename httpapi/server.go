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
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"stallfree/api"
	"stallfree/catalog"
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
	// SendBuffer is each client connection's SO_SNDBUF in bytes (0: kernel
	// autotuning); set it before Serve. New sets DefaultSendBuffer.
	SendBuffer int
	// MaxConns bounds the client connections open at once; beyond it a new
	// one gets 503 and is closed (0: no bound). Set it before Serve.
	MaxConns int
	ckpt     Checkpoints     // checkpoints.go
	groups   *groups.Service // coordinated prep (groups.go); nil: off
	peers    *relay.Client   // the node's client to the other nodes: a group's batches are its owner's
	relay    Relay           // this node's applied index, on relayed group requests
}

// New builds the server; token may be empty (no auth).
func New(n *node.Node, token string, log *slog.Logger) *Server {
	s := &Server{prep: n.Prep(), token: []byte(token), log: log, SendBuffer: DefaultSendBuffer}
	s.metrics = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(n.Registry(), promhttp.HandlerOpts{}))
	s.readers.New = func() any { return &itemReader{} }
	s.relay, s.peers = n.Control(), n.Control().Relay()
	s.router = newRouter(s.routes(n))
	s.srv = &fasthttp.Server{
		Handler:            s.recovering(s.handle),
		StreamRequestBody:  true,
		ErrorHandler:       s.parseError,
		Name:               "stallfree",
		ReadTimeout:        30 * time.Second,
		WriteTimeout:       60 * time.Second,
		IdleTimeout:        2 * time.Minute,
		MaxRequestBodySize: MaxBodySize,
		NoDefaultDate:      true,
		Logger:             fasthttpLogger{r: redactor{token: []byte(token)}, log: log},
	}
	return s
}

// Serve serves on ln until Shutdown.
func (s *Server) Serve(ln net.Listener) error {
	guarded := listen.Guard(ln, listen.Options{Name: "http", MaxConns: s.MaxConns, Refuse: refuseConn, Log: s.log})
	return s.srv.Serve(gatherListener{Listener: guarded, sendBuffer: s.SendBuffer})
}

// refuseConn answers a connection over MaxConns before closing it.
func refuseConn(c net.Conn) {
	const body = `{"error":"too many connections; retry"}`
	io.WriteString(c, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"+
		"Connection: close\r\nContent-Length: "+strconv.Itoa(len(body))+"\r\n\r\n"+body)
}

// Shutdown stops accepting and waits for in-flight requests.
func (s *Server) Shutdown(ctx context.Context) error { return s.srv.ShutdownWithContext(ctx) }

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

// handle routes a request: the table (routes.go) picks the handler, the
// token guards every /v1 path (before its route is known, so a client without
// the token learns nothing of the API), and names of datasets and jobs are
// checked before any handler sees them. Bodies arrive as streams: a stream
// route's handler reads its own, every other route's is read whole first.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	var segs [16]string
	path, seg := splitPath(ctx.URI().PathOriginal(), segs[:0])
	rt, p, allowed := s.router.match(string(ctx.Method()), path, seg)
	switch {
	case rt == nil:
		// Whatever the body, the answer is the same: it is not read, only
		// drained (bounded) after the answer.
		defer drainRefused(ctx, maxTooLargeDrain)
	case rt.stream:
		s.handleStream(ctx, rt, p)
		return
	default:
		limit := s.srv.MaxRequestBodySize
		if rt.limit != nil {
			limit = rt.limit()
		}
		if !s.readBody(ctx, limit) {
			return
		}
	}
	if len(seg) >= 2 && seg[0] == "v1" && !s.authorized(ctx) {
		ctx.Response.Header.Set("WWW-Authenticate", "Bearer")
		writeError(ctx, fasthttp.StatusUnauthorized, "missing or wrong bearer token")
		return
	}
	switch {
	case rt == nil && allowed:
		writeError(ctx, fasthttp.StatusMethodNotAllowed, "method not allowed")
		return
	case rt == nil:
		writeError(ctx, fasthttp.StatusNotFound, "no such route")
		return
	}
	if err := p.decodeNames(); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	rt.handle(ctx, p)
}

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

// handleStream serves a stream route, whose body is still unread. A request
// refused before its handler (no token, bad names) has up to 64 MiB of its
// body read and dropped, so a client still sending sees the status rather
// than a reset, and its connection is closed: nothing more of an
// unauthenticated body is read. An answer of 300 or more from the handler
// reads the rest of the body (bounded) first, for the same reason.
func (s *Server) handleStream(ctx *fasthttp.RequestCtx, rt *route, p params) {
	if !s.authorized(ctx) {
		ctx.Response.Header.Set("WWW-Authenticate", "Bearer")
		writeError(ctx, fasthttp.StatusUnauthorized, "missing or wrong bearer token")
		refuseStream(ctx)
		return
	}
	if err := p.decodeNames(); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		refuseStream(ctx)
		return
	}
	defer func() {
		if ctx.Response.StatusCode() >= 300 {
			drainRefused(ctx, maxDrain)
		}
	}()
	rt.handle(ctx, p)
}

// refuseStream drops up to maxTooLargeDrain of a refused stream's body and
// closes its connection.
func refuseStream(ctx *fasthttp.RequestCtx) {
	drainRefused(ctx, maxTooLargeDrain)
	ctx.SetConnectionClose()
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
