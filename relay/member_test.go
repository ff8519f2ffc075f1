package relay

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/clusterauth"
)

// With a member key, each request of the node's own (Do, JSON, Upload)
// carries a proof of its method and path with the query, which the
// receiver verifies; without one, none is sent.
func TestMemberKeySignsOwnRequests(t *testing.T) {
	key := clusterauth.Derive([]byte("secret"), "http")
	var mu sync.Mutex
	var proofs []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		mu.Lock()
		proofs = append(proofs, r.Method+" "+r.URL.RequestURI()+" "+r.Header.Get(clusterauth.HeaderMember))
		mu.Unlock()
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()
	addr := strings.TrimPrefix(srv.URL, "http://")
	c := New("n1", "", MemberKey(key))
	defer c.Close()
	resp, err := c.Do(ctx(t), http.MethodGet, addr, "/v1/internal/x?y=1", nil, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if _, err := c.JSON(ctx(t), http.MethodPost, addr, "/v1/j", map[string]int{"a": 1}, nil, nil, 1<<10); err != nil {
		t.Fatal(err)
	}
	up, err := c.Upload(ctx(t), addr, "/v1/internal/up", 3, nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	up.Write([]byte("abc"))
	if err := up.Answer(http.StatusCreated, 0); err != nil {
		t.Fatal(err)
	}
	up.Close()
	plain := New("n1", "")
	resp, err = plain.Do(ctx(t), http.MethodGet, addr, "/p", nil, 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	mu.Lock()
	defer mu.Unlock()
	if len(proofs) != 4 {
		t.Fatalf("requests %v", proofs)
	}
	for _, p := range proofs[:3] {
		f := strings.SplitN(p, " ", 3)
		if err := clusterauth.VerifyRequest(key, f[0], f[1], "n1", f[2], time.Now()); err != nil {
			t.Errorf("%s: %v", p, err)
		}
	}
	if !strings.HasSuffix(proofs[3], " ") {
		t.Errorf("a client without a key sent a proof: %q", proofs[3])
	}
}

// ForwardWaiting relays like Forward (its connection has small buffers).
func TestForwardWaiting(t *testing.T) {
	s, addr := stub(t, func(w http.ResponseWriter) { w.WriteHeader(http.StatusOK); io.WriteString(w, "batch") })
	in, out := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(in)
	defer fasthttp.ReleaseResponse(out)
	in.Header.SetMethod(http.MethodGet)
	c := New("n1", "")
	defer c.Close()
	if err := c.ForwardWaiting(ctx(t), addr, "/v1/groups/g/batches/0?wait=5s", in, out, nil, 100); err != nil {
		t.Fatal(err)
	}
	if s.uri != "/v1/groups/g/batches/0?wait=5s" || s.forwarded != "n1" || string(out.Body()) != "batch" {
		t.Fatalf("saw %q from %q, answered %q", s.uri, s.forwarded, out.Body())
	}
}

// An upload to nobody fails at the dial; an answer that is not HTTP is an
// error, not a status.
func TestUploadFailures(t *testing.T) {
	c := New("n1", "")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	go func() {
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		defer conn.Close()
		br := bufio.NewReader(conn)
		http.ReadRequest(br)
		io.WriteString(conn, "garbage\r\n\r\n")
	}()
	up, err := c.Upload(ctx(t), addr, "/x", 0, http.Header{"X-A": {"1"}}, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := up.Answer(http.StatusCreated, time.Second); err == nil {
		t.Fatal("garbage read as an answer")
	}
	up.Close()
	ln.Close()
	if _, err := c.Upload(ctx(t), addr, "/x", 0, nil, time.Second); err == nil {
		t.Fatal("an upload to a closed port opened")
	}
}
