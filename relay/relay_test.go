package relay

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/internal/testutil"
)

// seen is what a stub node received.
type seen struct {
	mu                      sync.Mutex
	method, uri, body       string
	forwarded, auth, ctype  string
	host, extra, connection string
	contentLength           int64
}

func stub(t *testing.T, answer func(w http.ResponseWriter)) (*seen, string) {
	t.Helper()
	s := &seen{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		s.method, s.uri, s.body = r.Method, r.URL.RequestURI(), string(b)
		s.forwarded, s.auth, s.ctype = r.Header.Get(api.HeaderForwarded), r.Header.Get("Authorization"), r.Header.Get("Content-Type")
		s.host, s.extra, s.connection = r.Host, r.Header.Get("X-Extra"), r.Header.Get("Connection")
		s.contentLength = r.ContentLength
		s.mu.Unlock()
		answer(w)
	}))
	t.Cleanup(srv.Close)
	return s, strings.TrimPrefix(srv.URL, "http://")
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// A request of the node's own names the node and carries the node's token,
// its body and its extra headers; without a token none is sent.
func TestDoIsTheNodesOwnRequest(t *testing.T) {
	s, addr := stub(t, func(w http.ResponseWriter) { w.WriteHeader(http.StatusTeapot) })
	c := New("n1", "sekrit")
	defer c.Close()
	// A reader whose length net/http cannot see for itself: the size given
	// is what the request declares.
	body := io.MultiReader(strings.NewReader("abc"))
	resp, err := c.Do(ctx(t), http.MethodPut, addr, "/v1/x?y=1", body, 3, http.Header{"X-Extra": {"e"}})
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTeapot {
		t.Fatalf("status %d: any answer comes back as it is", resp.StatusCode)
	}
	if s.method != http.MethodPut || s.uri != "/v1/x?y=1" || s.body != "abc" || s.contentLength != 3 || s.extra != "e" {
		t.Fatalf("saw %s %s %q (length %d, extra %q)", s.method, s.uri, s.body, s.contentLength, s.extra)
	}
	if s.forwarded != "n1" || s.auth != "Bearer sekrit" {
		t.Fatalf("forwarded %q, authorization %q", s.forwarded, s.auth)
	}
	if New("n2", "").Self() != "n2" {
		t.Fatal("Self")
	}
	resp, err = New("n2", "").Do(ctx(t), http.MethodGet, addr, "/", nil, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if s.auth != "" || s.body != "" || s.contentLength != 0 || s.forwarded != "n2" {
		t.Fatalf("without token or body: authorization %q, body %q (%d), forwarded %q", s.auth, s.body, s.contentLength, s.forwarded)
	}
	if _, err := c.Do(ctx(t), http.MethodGet, testutil.FreeAddr(t), "/", nil, 0, nil); err == nil {
		t.Fatal("no node listening, yet an answer")
	}
}

// A redirect is passed back, never followed to wherever it points.
func TestRedirectsAreNotFollowed(t *testing.T) {
	_, other := stub(t, func(w http.ResponseWriter) {})
	s, addr := stub(t, func(w http.ResponseWriter) {
		w.Header().Set("Location", "http://"+other+"/elsewhere")
		w.WriteHeader(http.StatusFound)
	})
	resp, err := New("n1", "tok").Do(ctx(t), http.MethodGet, addr, "/here", nil, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusFound || s.uri != "/here" {
		t.Fatalf("status %d after %s", resp.StatusCode, s.uri)
	}
}

// JSON sends its body as JSON and decodes the answer; refusals come back as
// *api.Error with the status, the message (or the text) and Retry-After;
// an answer over the limit or not JSON is an error; so is no answer.
func TestJSON(t *testing.T) {
	status, answer, retry := http.StatusCreated, `{"name":"ds","items":7}`, ""
	s, addr := stub(t, func(w http.ResponseWriter) {
		if retry != "" {
			w.Header().Set("Retry-After", retry)
		}
		w.Header().Set(api.HeaderApplied, "42")
		w.WriteHeader(status)
		io.WriteString(w, answer)
	})
	c := New("n1", "")
	var got api.Dataset
	resp, err := c.JSON(ctx(t), http.MethodPut, addr, "/v1/datasets/ds", api.PutDataset{Source: "/data"}, &got, nil, 1<<10)
	if err != nil || resp.StatusCode != http.StatusCreated || resp.Header.Get(api.HeaderApplied) != "42" {
		t.Fatalf("JSON: %v, %v", resp, err)
	}
	if got.Name != "ds" || got.Items != 7 || s.body != `{"source":"/data"}` || s.ctype != "application/json" {
		t.Fatalf("decoded %+v from a request of %q (%s)", got, s.body, s.ctype)
	}
	if _, err := c.JSON(ctx(t), http.MethodGet, addr, "/", nil, nil, nil, 1<<10); err != nil || s.body != "" || s.ctype != "" {
		t.Fatalf("no body: %v, sent %q (%s)", err, s.body, s.ctype)
	}
	if _, err := c.JSON(ctx(t), http.MethodGet, addr, "/", nil, nil, nil, int64(len(answer))); err != nil {
		t.Fatalf("an answer of exactly the limit: %v", err)
	}
	if _, err := c.JSON(ctx(t), http.MethodGet, addr, "/", nil, nil, nil, int64(len(answer)-1)); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("an answer one byte over the limit: %v", err)
	}
	var e *api.Error
	status, answer, retry = http.StatusServiceUnavailable, `{"error":"leadership is moving"}`, "1"
	if resp, err := c.JSON(ctx(t), http.MethodGet, addr, "/", nil, nil, nil, 1<<10); !errors.As(err, &e) || e.Status != 503 ||
		e.Message != "leadership is moving" || !e.Retry || resp.StatusCode != 503 {
		t.Fatalf("503: %v", err)
	}
	status, answer, retry = http.StatusMultipleChoices, " upstream broke\n", ""
	if _, err := c.JSON(ctx(t), http.MethodGet, addr, "/", nil, nil, nil, 1<<10); !errors.As(err, &e) || e.Status != 300 || e.Message != "upstream broke" || e.Retry {
		t.Fatalf("plain-text 300: %v", err)
	}
	status, answer = http.StatusOK, "not json"
	if _, err := c.JSON(ctx(t), http.MethodGet, addr, "/", nil, &got, nil, 1<<10); err == nil || errors.As(err, &e) {
		t.Fatalf("undecodable 200: %v", err)
	}
	if _, err := c.JSON(ctx(t), http.MethodPut, addr, "/", func() {}, nil, nil, 1<<10); err == nil {
		t.Fatal("a body that is not JSON was sent")
	}
	if resp, err := c.JSON(ctx(t), http.MethodGet, testutil.FreeAddr(t), "/", nil, nil, nil, 1<<10); err == nil || resp != nil {
		t.Fatal("no node listening, yet an answer")
	}
}

// Forward passes a client's request on with the client's credentials (not
// the node's), its query, body and headers but not the hop-by-hop ones, adds
// the caller's headers, and copies the status, headers and body back.
func TestForward(t *testing.T) {
	body := strings.Repeat("b", 100)
	s, addr := stub(t, func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/x-thing")
		w.Header().Add("X-Answer", "1")
		w.Header().Add("X-Answer", "2")
		w.WriteHeader(http.StatusAccepted)
		io.WriteString(w, body)
	})
	in, out := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(in)
	defer fasthttp.ReleaseResponse(out)
	in.Header.SetMethod(http.MethodPost)
	in.SetRequestURI("http://entry:1/v1/groups/g?wait=1")
	in.Header.Set("Authorization", "Bearer client")
	in.Header.Set("Connection", "keep-alive")
	in.Header.SetContentType("application/json")
	in.SetBodyString(`{"a":1}`)
	c := New("n1", "node-token")
	if err := c.Forward(ctx(t), addr, "/v1/groups/g?wait=1", in, out, http.Header{"X-Extra": {"x"}}, 100); err != nil {
		t.Fatal(err)
	}
	if s.method != http.MethodPost || s.uri != "/v1/groups/g?wait=1" || s.body != `{"a":1}` || s.ctype != "application/json" {
		t.Fatalf("saw %s %s %q (%s)", s.method, s.uri, s.body, s.ctype)
	}
	if s.auth != "Bearer client" || s.forwarded != "n1" || s.extra != "x" || s.host != addr {
		t.Fatalf("authorization %q, forwarded %q, extra %q, host %q", s.auth, s.forwarded, s.extra, s.host)
	}
	if out.StatusCode() != http.StatusAccepted || string(out.Body()) != body || string(out.Header.ContentType()) != "application/x-thing" {
		t.Fatalf("answer %d %q (%s)", out.StatusCode(), out.Body(), out.Header.ContentType())
	}
	var answers []string
	for k, v := range out.Header.All() {
		if string(k) == "X-Answer" {
			answers = append(answers, string(v))
		}
	}
	if strings.Join(answers, ",") != "1,2" {
		t.Fatalf("X-Answer %v", answers)
	}

	out.Reset()
	if err := c.Forward(ctx(t), addr, "/", in, out, nil, 99); !errors.Is(err, ErrTooLarge) || out.StatusCode() != http.StatusOK || len(out.Body()) != 0 {
		t.Fatalf("an answer over the limit: %v, and out holds %d %q", err, out.StatusCode(), out.Body())
	}
	if err := c.Forward(ctx(t), testutil.FreeAddr(t), "/", in, out, nil, 100); err == nil {
		t.Fatal("no node listening, yet an answer")
	}
}

// An upload's bytes reach the receiver as written, and its answer is read:
// the wanted status is nil, another an *api.Error; an upload closed early is
// a body cut off, which the receiver sees.
func TestUpload(t *testing.T) {
	got := make(chan string, 1)
	status := http.StatusCreated
	s, addr := stub(t, func(w http.ResponseWriter) { w.WriteHeader(status) })
	c := New("n1", "tok")
	up, err := c.Upload(ctx(t), addr, "/v1/internal/p", 6, http.Header{api.HeaderChecksum: {"sum"}}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	up.Write([]byte("abc"))
	up.Write([]byte("def"))
	if err := up.Answer(http.StatusCreated, 0); err != nil {
		t.Fatal(err)
	}
	up.Close()
	if s.method != http.MethodPut || s.uri != "/v1/internal/p" || s.body != "abcdef" || s.auth != "Bearer tok" || s.forwarded != "n1" {
		t.Fatalf("saw %s %s %q, authorization %q, forwarded %q", s.method, s.uri, s.body, s.auth, s.forwarded)
	}

	status = http.StatusInsufficientStorage
	up, err = c.Upload(ctx(t), addr, "/p", 1, nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	up.Write([]byte("x"))
	var e *api.Error
	if err := up.Answer(http.StatusCreated, 0); !errors.As(err, &e) || e.Status != http.StatusInsufficientStorage {
		t.Fatalf("507: %v", err)
	}
	up.Close()

	// A raw receiver: the body ends early when the upload is closed.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		b, _ := io.ReadAll(conn)
		got <- string(b)
	}()
	up, err = c.Upload(ctx(t), ln.Addr().String(), "/p", 10, nil, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	up.Write([]byte("12345"))
	up.Close()
	raw := <-got
	if !strings.HasPrefix(raw, "PUT /p HTTP/1.1\r\n") || !strings.Contains(raw, "Content-Length: 10\r\n") || !strings.HasSuffix(raw, "\r\n\r\n12345") {
		t.Fatalf("the receiver saw %q", raw)
	}
	if err := up.Answer(http.StatusCreated, time.Second); err == nil {
		t.Fatal("a closed upload has an answer")
	}
	if _, err := c.Upload(ctx(t), testutil.FreeAddr(t), "/p", 1, nil, time.Minute); err == nil {
		t.Fatal("no node listening, yet an upload")
	}
}
