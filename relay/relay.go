// Package relay is the one HTTP client a node uses to reach the other nodes'
// APIs: writes relayed to the raft leader (control), items written at their
// owner (the prep cache), a group's batches at its owner (coordinated prep),
// a checkpoint part's copy at its partner, and members' figures. A node
// builds one Client and every part of it shares its connections.
//
// Every request it sends names the node it comes from (api.HeaderForwarded),
// so the receiver never relays it again. A request of the node's own carries
// the cluster's API token; a client's request passed on (Forward) carries
// the client's credentials, so a relay never lends a client its own.
package relay

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/clusterauth"
)

// Client is safe for concurrent use.
type Client struct {
	self, token string
	memberKey   []byte
	http        *http.Client
	// waits carries requests that wait at the other end (ForwardWaiting):
	// small buffers, since many may be open at once.
	waits *http.Client
	dial  func(ctx context.Context, network, addr string) (net.Conn, error)
}

// An Option configures a Client.
type Option func(*Client)

// MemberKey signs the node's own requests with key (clusterauth.SignRequest),
// which a receiver requires on its internal routes. Empty: none.
func MemberKey(key []byte) Option { return func(c *Client) { c.memberKey = key } }

// New returns the client of node self, which presents token (empty: none)
// on its own requests.
func New(self, token string, opts ...Option) *Client {
	d := &net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     time.Minute,
		DisableCompression:  true,
		// Checkpoint parts and group batches are megabytes: large buffers
		// keep the syscalls per byte low.
		WriteBufferSize: 256 << 10,
		ReadBufferSize:  256 << 10,
	}
	// No client-wide timeout: each call is bounded by its context, since a
	// part's copy may take minutes and a catalog read must not.
	// A node's API never redirects; a redirect is passed back, not followed.
	noRedirects := func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	small := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute,
		DisableCompression: true, WriteBufferSize: 4 << 10, ReadBufferSize: 4 << 10}
	c := &Client{self: self, token: token, http: &http.Client{Transport: tr, CheckRedirect: noRedirects},
		waits: &http.Client{Transport: small, CheckRedirect: noRedirects}, dial: d.DialContext}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Self is the node the client's requests come from.
func (c *Client) Self() string { return c.self }

// Close closes the idle connections.
func (c *Client) Close() {
	c.http.CloseIdleConnections()
	c.waits.CloseIdleConnections()
}

// own marks a request (method, path with its query) as this node's own.
func (c *Client) own(h http.Header, method, path string) {
	h.Set(api.HeaderForwarded, c.self)
	if c.token != "" {
		h.Set("Authorization", "Bearer "+c.token)
	}
	if len(c.memberKey) > 0 {
		h.Set(clusterauth.HeaderMember, clusterauth.SignRequest(c.memberKey, method, path, c.self, time.Now()))
	}
}

// Do sends a request of this node's own to the API at addr. body (nil:
// none) is size bytes long; header is added to the request. An error means
// no answer came; any answer, whatever its status, is returned and the
// caller closes its body.
func (c *Client) Do(ctx context.Context, method, addr, path string, body io.Reader, size int64, header http.Header) (*http.Response, error) {
	if body == nil || size == 0 {
		body = http.NoBody
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path, body)
	if err != nil {
		return nil, err
	}
	if body != http.NoBody {
		req.ContentLength = size
	}
	for k, v := range header {
		req.Header[k] = v
	}
	c.own(req.Header, method, path)
	return c.http.Do(req)
}

// maxErrorBody bounds what is read of an answer that is an error.
const maxErrorBody = 64 << 10

// AnswerError is another node's non-2xx answer as an *api.Error: its status,
// its JSON error (or its text) and whether it asked to be retried.
func AnswerError(resp *http.Response) *api.Error {
	b, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	e := &api.Error{Status: resp.StatusCode, Retry: resp.Header.Get("Retry-After") != ""}
	if json.Unmarshal(b, e) != nil || e.Message == "" {
		e.Message = string(bytes.TrimSpace(b))
	}
	return e
}

// ErrTooLarge is an answer longer than the caller allowed.
var ErrTooLarge = errors.New("answer too large")

// JSON sends a request of this node's own with in as its JSON body (nil:
// none) and decodes a 2xx answer of at most limit bytes into out (nil: read
// and dropped). A non-2xx answer is an *api.Error (AnswerError); no answer
// is the transport's error. The answer's body is closed on return; its
// status and header stay readable.
func (c *Client) JSON(ctx context.Context, method, addr, path string, in, out any, header http.Header, limit int64) (*http.Response, error) {
	var body []byte
	if in != nil {
		var err error
		if body, err = json.Marshal(in); err != nil {
			return nil, err
		}
		header = header.Clone()
		if header == nil {
			header = http.Header{}
		}
		header.Set("Content-Type", "application/json")
	}
	resp, err := c.Do(ctx, method, addr, path, bytes.NewReader(body), int64(len(body)), header)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		return resp, AnswerError(resp)
	}
	// If chains here and below, not tagless switches: Go's coverage gives a
	// case expression no block, so mutation testing could not reach them.
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return resp, fmt.Errorf("answer from %s: %w", addr, err)
	}
	if int64(len(b)) > limit {
		return resp, fmt.Errorf("answer from %s: %w (over %d bytes)", addr, ErrTooLarge, limit)
	}
	if out != nil {
		if err := json.Unmarshal(b, out); err != nil {
			return resp, fmt.Errorf("answer from %s: %w", addr, err)
		}
	}
	return resp, nil
}

// Forward passes in, a client's request, to the API at addr as path and
// query uri, with the client's credentials and header added, and copies the
// answer (a body of at most limit bytes) into out. An error means no whole
// answer came, and out is untouched.
func (c *Client) Forward(ctx context.Context, addr, uri string, in *fasthttp.Request, out *fasthttp.Response, header http.Header, limit int64) error {
	return c.forward(ctx, c.http, addr, uri, in, out, header, limit)
}

// ForwardWaiting is Forward for a request that may wait at addr for its
// answer (a group read with ?wait=): its connection has small buffers, so
// that the many a node may relay at once cost little memory each.
func (c *Client) ForwardWaiting(ctx context.Context, addr, uri string, in *fasthttp.Request, out *fasthttp.Response, header http.Header, limit int64) error {
	return c.forward(ctx, c.waits, addr, uri, in, out, header, limit)
}

func (c *Client) forward(ctx context.Context, via *http.Client, addr, uri string, in *fasthttp.Request, out *fasthttp.Response, header http.Header, limit int64) error {
	req, err := http.NewRequestWithContext(ctx, string(in.Header.Method()), "http://"+addr+uri, bytes.NewReader(in.Body()))
	if err != nil {
		return err
	}
	for k, v := range in.Header.All() {
		if !hopByHop(string(k)) {
			req.Header.Add(string(k), string(v))
		}
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set(api.HeaderForwarded, c.self)
	if len(c.memberKey) > 0 {
		// The receiver believes the mark only with a member's proof: a
		// client could set the header too. Signed over the request line Go
		// will send, which may escape uri differently.
		req.Header.Set(clusterauth.HeaderMember, clusterauth.SignRequest(c.memberKey, req.Method, req.URL.RequestURI(), c.self, time.Now()))
	}
	resp, err := via.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return err
	}
	if int64(len(b)) > limit {
		return fmt.Errorf("%w (over %d bytes)", ErrTooLarge, limit)
	}
	out.SetStatusCode(resp.StatusCode)
	for k, vs := range resp.Header {
		if hopByHop(k) || k == "Date" || k == "Server" {
			continue // this node's own, set when it answers
		}
		if k == "Content-Type" {
			out.Header.SetContentType(vs[0])
			continue
		}
		for _, v := range vs {
			out.Header.Add(k, v)
		}
	}
	out.SetBody(b)
	return nil
}

// hopByHop headers describe one connection, not the request: the relay's
// own connection sets its own.
func hopByHop(k string) bool {
	switch strings.ToLower(k) {
	case "host", "content-length", "connection", "transfer-encoding", "keep-alive", "te", "trailer", "upgrade":
		return true
	}
	return false
}

// Upload is a PUT of this node's own whose body is written straight to a
// connection of its own as the caller produces it: each Write goes to the
// socket from the caller's memory (net/http would copy it through a pipe
// and a buffer, 32 KiB at a time). Closing it before the last byte cuts the
// body off, which the receiver sees as a body ended early.
type Upload struct {
	conn net.Conn
	addr string
	idle time.Duration
}

// Upload opens a PUT of size bytes to path at addr, with header. The
// connection is given up when a write, or the wait for the answer, makes
// no progress for idle: a large part on a slow link takes as long as it
// takes, a stalled one is cut off (the receiver keeps the same rule,
// --idle-timeout).
func (c *Client) Upload(ctx context.Context, addr, path string, size int64, header http.Header, idle time.Duration) (*Upload, error) {
	conn, err := c.dial(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	conn.SetDeadline(time.Now().Add(idle))
	h := header.Clone()
	if h == nil {
		h = http.Header{}
	}
	c.own(h, http.MethodPut, path)
	var head bytes.Buffer
	fmt.Fprintf(&head, "PUT %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\nConnection: close\r\n", path, addr, size)
	h.Write(&head)
	head.WriteString("\r\n")
	if _, err := conn.Write(head.Bytes()); err != nil {
		conn.Close()
		return nil, err
	}
	return &Upload{conn: conn, addr: addr, idle: idle}, nil
}

// Write sends the next bytes of the body.
func (u *Upload) Write(p []byte) (int, error) {
	u.conn.SetWriteDeadline(time.Now().Add(u.idle))
	return u.conn.Write(p)
}

// Answer reads the receiver's answer, waiting at most within (0: the
// upload's idle time): nil when its status is want, else an *api.Error
// (AnswerError), or the transport's error when none came.
func (u *Upload) Answer(want int, within time.Duration) error {
	if within <= 0 {
		within = u.idle
	}
	u.conn.SetReadDeadline(time.Now().Add(within))
	resp, err := http.ReadResponse(bufio.NewReader(u.conn), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		return AnswerError(resp)
	}
	return nil
}

// Close ends the upload; before the last byte, it cuts the body off.
func (u *Upload) Close() error { return u.conn.Close() }
