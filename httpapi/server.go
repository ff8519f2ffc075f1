// Package httpapi serves the public HTTP API (docs/api.md) with fasthttp. It
// is thin: it parses paths and bodies, checks the token, maps errors to
// status codes and puts bytes on the wire; every rule about the catalog and
// the items lives in the node.
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
	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/groups"
	"stallfree/listen"
	"stallfree/node"
	"stallfree/source"
)

// MaxBodySize bounds request bodies (batch requests, registrations); larger
// ones get 413 before the handler runs.
const MaxBodySize = 1 << 20

// Server is the HTTP front of one node.
type Server struct {
	node    *node.Node
	prep    prep
	token   []byte
	log     *slog.Logger
	srv     *fasthttp.Server
	metrics fasthttp.RequestHandler
	readers sync.Pool
	// relayer carries reads a restarted follower cannot answer yet to the
	// raft leader.
	relayer *fasthttp.Client
	// SendBuffer is each client connection's SO_SNDBUF in bytes (0: kernel
	// autotuning); set it before Serve. New sets DefaultSendBuffer.
	SendBuffer int
	// MaxConns bounds the client connections open at once; beyond it a new
	// one gets 503 and is closed (0: no bound). Set it before Serve.
	MaxConns   int
	ckpt       Checkpoints     // checkpoints.go
	groups     *groups.Service // coordinated prep (groups.go); nil: off
	groupRelay *fasthttp.Client
}

// New builds the server; token may be empty (no auth).
func New(n *node.Node, token string, log *slog.Logger) *Server {
	s := &Server{node: n, prep: n.Prep(), token: []byte(token), log: log, SendBuffer: DefaultSendBuffer}
	s.metrics = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(n.Registry(), promhttp.HandlerOpts{}))
	s.readers.New = func() any { return &itemReader{} }
	s.relayer = &fasthttp.Client{Name: "stallfree-relay", ReadTimeout: time.Minute, MaxResponseBodySize: 1 << 30}
	s.srv = &fasthttp.Server{
		Handler:            s.recovering(s.streamed(s.handle)), // streamed: checkpoints.go
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

// statusOf maps domain errors to the contract's status codes.
func statusOf(err error) int {
	switch {
	case errors.Is(err, catalog.ErrNotFound):
		return fasthttp.StatusNotFound
	case errors.Is(err, catalog.ErrConflict):
		return fasthttp.StatusConflict
	case errors.Is(err, catalog.ErrNoLeader), errors.Is(err, catalog.ErrNotLeader):
		return fasthttp.StatusServiceUnavailable
	case errors.Is(err, node.ErrForbiddenSource), errors.Is(err, source.ErrDenied):
		return fasthttp.StatusForbidden
	case errors.Is(err, source.ErrNotFound):
		return fasthttp.StatusNotFound
	case errors.Is(err, source.ErrUnavailable):
		return fasthttp.StatusBadGateway
	case errors.Is(err, node.ErrBadRequest), errors.Is(err, source.ErrBadKey):
		return fasthttp.StatusBadRequest
	case errors.Is(err, source.ErrChanged):
		return fasthttp.StatusBadGateway
	case errors.Is(err, node.ErrTooLarge):
		return fasthttp.StatusRequestEntityTooLarge
	case errors.Is(err, source.ErrTimeout):
		return fasthttp.StatusGatewayTimeout
	}
	return fasthttp.StatusInternalServerError
}

func fail(ctx *fasthttp.RequestCtx, err error) {
	if errors.Is(err, catalog.ErrNotWritten) {
		writeError(ctx, fasthttp.StatusNotFound, "not written") // the contract's exact body
		return
	}
	if code, ok := derivedStatus(err); ok {
		writeError(ctx, code, err.Error())
		return
	}
	if errors.Is(err, node.ErrBusy) {
		writeError(ctx, fasthttp.StatusServiceUnavailable, err.Error())
		ctx.Response.Header.Set("Retry-After", "1") // writeError resets the response
		return
	}
	if e, ok := errors.AsType[*api.Error](err); ok {
		writeError(ctx, e.Status, e.Message) // relayed as the leader said it
		return
	}
	writeError(ctx, statusOf(err), err.Error())
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

func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	var segs [16]string
	path, seg := splitPath(ctx.URI().PathOriginal(), segs[:0])
	method := string(ctx.Method())
	if len(seg) == 1 && method == fasthttp.MethodGet {
		switch seg[0] {
		case "healthz":
			ctx.SetContentType("text/plain")
			ctx.SetBodyString("ok\n")
			return
		case "metrics":
			s.metrics(ctx)
			return
		case "readyz":
			if ok, why := s.node.Ready(); !ok {
				writeError(ctx, fasthttp.StatusServiceUnavailable, why)
				return
			}
			ctx.SetContentType("text/plain")
			ctx.SetBodyString("ready\n")
			return
		}
	}
	if len(seg) < 2 || seg[0] != "v1" {
		writeError(ctx, fasthttp.StatusNotFound, "no such route")
		return
	}
	if !s.authorized(ctx) {
		ctx.Response.Header.Set("WWW-Authenticate", "Bearer")
		writeError(ctx, fasthttp.StatusUnauthorized, "missing or wrong bearer token")
		return
	}
	if s.catalogNotReady(ctx, method, seg) {
		return
	}
	switch seg[1] {
	case "groups":
		s.groupRoutes(ctx, method, seg[2:])
		return
	case "stats":
		if len(seg) == 2 && method == fasthttp.MethodGet {
			st := s.node.Stats()
			st.Checkpoints = s.checkpointStats()
			writeJSON(ctx, 200, st)
			return
		}
	case "cluster":
		if len(seg) == 2 && method == fasthttp.MethodGet {
			writeJSON(ctx, 200, s.node.Cluster())
			s.markApplied(ctx) // a joining node's catch-up target (node.CatalogReady)
			return
		}
	case "datasets":
		s.datasets(ctx, method, path, seg[2:])
		return
	case "jobs":
		s.jobs(ctx, method, seg[2:])
		return
	case "plan":
		s.plan(ctx, method, seg[2:])
		return
	case "loader":
		if len(seg) == 3 && seg[2] == "wait" && method == fasthttp.MethodPost {
			s.loaderWait(ctx)
			return
		}
	}
	writeError(ctx, fasthttp.StatusNotFound, "no such route")
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

// datasets serves /v1/datasets/...; seg are path's segments after "datasets".
func (s *Server) datasets(ctx *fasthttp.RequestCtx, method, path string, seg []string) {
	if len(seg) == 0 {
		if method != fasthttp.MethodGet {
			methodNotAllowed(ctx)
			return
		}
		infos := s.node.Datasets()
		s.countWritten(infos)
		writeJSON(ctx, 200, infos)
		return
	}
	name, err := decodeSegment("dataset", seg[0])
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if len(seg) == 1 {
		switch method {
		case fasthttp.MethodPut:
			s.putDataset(ctx, name)
		case fasthttp.MethodGet:
			if d, ok := s.dataset(ctx, name, true); ok {
				infos := []api.Dataset{node.DatasetInfo(d)}
				s.countWritten(infos)
				writeJSON(ctx, 200, infos[0])
			}
		case fasthttp.MethodDelete:
			rctx, cancel := reqContext(ctx, 30*time.Second)
			defer cancel()
			if err := s.node.DeleteDataset(rctx, name); err != nil {
				fail(ctx, err)
				return
			}
			s.markApplied(ctx)
			ctx.SetStatusCode(fasthttp.StatusNoContent)
		default:
			methodNotAllowed(ctx)
		}
		return
	}
	if seg[1] == "registration" && len(seg) == 2 {
		s.registration(ctx, method, name)
		return
	}
	d, ok := s.dataset(ctx, name, seg[1] != "warmup")
	if !ok {
		return
	}
	switch seg[1] {
	case "items":
		if method != fasthttp.MethodGet {
			methodNotAllowed(ctx)
			return
		}
		key, err := decodeKey(lastSegments(path, seg[2:]))
		if err != nil {
			fail(ctx, err)
			return
		}
		i, ok := d.Manifest.Index(key)
		if !ok {
			writeError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("dataset %s has no key %q", d.Name, key))
			return
		}
		s.serveItem(ctx, d, i)
		return
	case "index":
		if len(seg) == 3 && method == fasthttp.MethodPut {
			s.putItem(ctx, d, seg[2])
			return
		}
		if len(seg) != 3 || method != fasthttp.MethodGet {
			break
		}
		i, err := strconv.Atoi(seg[2])
		if err != nil || i < 0 || i >= d.Manifest.Len() {
			writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("index %q: want an integer in [0,%d)", seg[2], d.Manifest.Len()))
			return
		}
		switch cache := string(ctx.QueryArgs().Peek("cache")); cache {
		case "":
			s.serveItem(ctx, d, i)
		case "bypass":
			s.serveUncached(ctx, d, i)
		default:
			writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("cache=%q: the only option is bypass", cache))
		}
		return
	case "batch":
		if len(seg) != 2 || method != fasthttp.MethodPost {
			break
		}
		s.batch(ctx, d)
		return
	case "samples":
		s.samples(ctx, method, d, seg[2:])
		return
	case "owners":
		if len(seg) != 2 || method != fasthttp.MethodGet {
			break
		}
		b, err := msgpack.Marshal(s.node.Owners(d))
		if err != nil {
			fail(ctx, err)
			return
		}
		setRing(ctx, s.node.RingVersion())
		ctx.SetContentType("application/msgpack")
		ctx.SetBody(b)
		return
	case "warmup":
		if len(seg) != 2 {
			break
		}
		switch method {
		case fasthttp.MethodPost:
			if d.Derived() {
				writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("%s is derived: loaders write its items, there is nothing to warm", d.Name))
				return
			}
			writeJSON(ctx, fasthttp.StatusAccepted, s.node.StartWarmup(d))
		case fasthttp.MethodGet:
			writeJSON(ctx, 200, s.node.WarmupProgress(d))
		default:
			methodNotAllowed(ctx)
		}
		return
	}
	writeError(ctx, fasthttp.StatusNotFound, "no such route")
}

// registration answers how far a registration has got. The leader
// registers, so a follower relays the question to it.
func (s *Server) registration(ctx *fasthttp.RequestCtx, method, name string) {
	if method != fasthttp.MethodGet {
		methodNotAllowed(ctx)
		return
	}
	if s.relayUnknown(ctx) {
		return
	}
	r, ok := s.node.Registration(name)
	if !ok {
		writeError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("no registration of %q on this node since it started", name))
		return
	}
	writeJSON(ctx, 200, r)
}

// dataset finds the dataset a request names; when this node does not know
// it, the request is answered and ok is false. Reads any member answers alike
// (relay) are answered by the leader then; node-local operations (warm-up)
// get 404 once the follower grace has passed.
func (s *Server) dataset(ctx *fasthttp.RequestCtx, name string, relay bool) (*catalog.Dataset, bool) {
	if relay && !s.node.HasDataset(name) && s.relayUnknown(ctx) {
		return nil, false
	}
	rctx, cancel := reqContext(ctx, time.Minute)
	defer cancel()
	d, err := s.node.Dataset(rctx, name)
	if err != nil {
		fail(ctx, err)
		return nil, false
	}
	return d, true
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

func (s *Server) putDataset(ctx *fasthttp.RequestCtx, name string) {
	var req api.PutDataset
	if err := decodeStrict(ctx.PostBody(), &req); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if req.DerivedFrom != "" || req.Stage != "" {
		s.putDerived(ctx, name, req)
		return
	}
	if req.Quota.Given {
		s.putQuota(ctx, name, req)
		return
	}
	if req.Source == "" {
		writeError(ctx, fasthttp.StatusBadRequest, `body needs {"source": "dir:///abs/path"}`)
		return
	}
	rctx, cancel := reqContext(ctx, 10*time.Minute)
	defer cancel()
	d, created, err := s.node.PutDataset(rctx, name, req.Source)
	if err != nil {
		fail(ctx, err)
		return
	}
	code := fasthttp.StatusOK
	if created {
		code = fasthttp.StatusCreated
	}
	s.markApplied(ctx)
	writeJSON(ctx, code, d)
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

// serveUncached reads an item from storage without touching the cache
// (?cache=bypass): cachectl analyze measures the cold ingestion rate with it
// without evicting or filling anything.
func (s *Server) serveUncached(ctx *fasthttp.RequestCtx, d *catalog.Dataset, i int) {
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	data, sum, err := s.node.ReadUncached(rctx, d, i)
	if err != nil {
		fail(ctx, err)
		return
	}
	h := &ctx.Response.Header
	h.Set("X-Cache", "miss")
	h.Set("X-Key", d.Manifest.Key(i))
	h.Set("ETag", `"`+strconv.FormatUint(sum, 16)+`"`)
	ctx.SetContentType("application/octet-stream")
	s.node.ServedBytes(len(data))
	ctx.Response.SetBodyRaw(data)
}

func (s *Server) serveItem(ctx *fasthttp.RequestCtx, d *catalog.Dataset, i int) {
	// No deadline here: a hit needs none, and fills bound themselves.
	it, err := s.node.Get(context.Background(), d, i)
	if err != nil {
		fail(ctx, err)
		return
	}
	h := &ctx.Response.Header
	setRing(ctx, s.node.RingVersion())
	h.Set("X-Cache", string(it.Cache))
	h.Set("X-Key", it.Key)
	var etag [18]byte // built on the stack: a hit allocates nothing
	h.SetBytesV("ETag", append(strconv.AppendUint(append(etag[:0], '"'), it.Sum, 16), '"'))
	ctx.SetContentType("application/octet-stream")
	s.node.ServedBytes(len(it.Data))
	r := s.readers.Get().(*itemReader)
	r.item, r.pool = it, &s.readers
	r.conn, _ = ctx.Conn().(*gatherConn)
	ctx.SetBodyStream(r, len(it.Data))
}
