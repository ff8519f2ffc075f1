package control

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/internal/testcatalog"
	"stallfree/internal/testutil"
	"stallfree/relay"
)

// lone is the cluster of a node that runs alone.
type lone struct{ self string }

func (l lone) Members() []string            { return []string{l.self} }
func (lone) HTTPAddr(string) (string, bool) { return "", false }

// openLeader is control over a one-member raft that leads.
func openLeader(t *testing.T) *Control {
	t.Helper()
	return New(Config{Name: "n1", Logger: testutil.Discard()}, testcatalog.Leader(t, "n1"), lone{"n1"})
}

// leaderStub is the leader's HTTP API as a relaying follower sees it: it
// records the last request and answers as told.
type leaderStub struct {
	srv                   *httptest.Server
	method, path, body    string
	forwarded, auth, ctyp string
	status                int
	answer, applied       string
	retryAfter            string
}

func newLeaderStub(t *testing.T) *leaderStub {
	s := &leaderStub{status: http.StatusOK}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.method, s.path, s.body = r.Method, r.URL.Path, string(b)
		s.forwarded, s.auth, s.ctyp = r.Header.Get(api.HeaderForwarded), r.Header.Get("Authorization"), r.Header.Get("Content-Type")
		if s.applied != "" {
			w.Header().Set(api.HeaderApplied, s.applied)
		}
		if s.retryAfter != "" {
			w.Header().Set("Retry-After", s.retryAfter)
		}
		w.WriteHeader(s.status)
		io.WriteString(w, s.answer)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *leaderStub) addr() string { return strings.TrimPrefix(s.srv.URL, "http://") }

// A relayed write reaches the leader as this node's own request: its method,
// path and JSON body, marked relayed and with the node's token; the answer
// comes back decoded with the raft index the leader applied it at.
func TestRelayCarriesTheRequestAndItsAnswer(t *testing.T) {
	s := newLeaderStub(t)
	s.status, s.answer, s.applied = http.StatusCreated, `{"name":"ds","items":7}`, "42"
	l := relay.New("n2", "sekrit")
	var got api.Dataset
	code, applied, err := writeTo(l, s.addr(), http.MethodPut, "/v1/datasets/ds", api.PutDataset{Source: "/data"}, &got, 5*time.Second)
	if err != nil || code != http.StatusCreated || applied != 42 {
		t.Fatalf("relay: code %d, applied %d, %v; want 201, 42, nil", code, applied, err)
	}
	if got.Name != "ds" || got.Items != 7 {
		t.Fatalf("decoded %+v", got)
	}
	if s.method != http.MethodPut || s.path != "/v1/datasets/ds" || s.body != `{"source":"/data"}` || s.ctyp != "application/json" {
		t.Fatalf("leader saw %s %s %q (%s)", s.method, s.path, s.body, s.ctyp)
	}
	if s.forwarded != "n2" || s.auth != "Bearer sekrit" {
		t.Fatalf("leader saw forwarded %q, authorization %q", s.forwarded, s.auth)
	}

	// No body, no token, no index: nothing of them is sent or made up.
	s.status, s.answer, s.applied = http.StatusOK, "", ""
	code, applied, err = writeTo(relay.New("n3", ""), s.addr(), http.MethodDelete, "/v1/jobs/j", nil, nil, 5*time.Second)
	if err != nil || code != http.StatusOK || applied != 0 {
		t.Fatalf("relay without body: %d, %d, %v", code, applied, err)
	}
	if s.body != "" || s.auth != "" || s.ctyp != "" || s.forwarded != "n3" {
		t.Fatalf("leader saw body %q, authorization %q, content type %q, forwarded %q", s.body, s.auth, s.ctyp, s.forwarded)
	}
}

// The leader's refusal comes back with its status and message; an answer
// that is not the API's error body comes back as text; a leader that does
// not answer is a 503; an undecodable 2xx is an error.
func TestRelayErrors(t *testing.T) {
	s := newLeaderStub(t)
	l := relay.New("n2", "")
	var e *api.Error

	s.status, s.answer = http.StatusConflict, `{"error":"dataset ds is registered with source /x"}`
	code, _, err := writeTo(l, s.addr(), http.MethodPut, "/v1/datasets/ds", nil, nil, 5*time.Second)
	if !errors.As(err, &e) || code != http.StatusConflict || e.Status != http.StatusConflict || e.Message != "dataset ds is registered with source /x" {
		t.Fatalf("refusal: code %d, %v", code, err)
	}
	if e.Retry {
		t.Fatal("a refusal without Retry-After came back as one to retry")
	}
	// A leader that says "come back" (leadership moving under it) is passed
	// on as such, so the client retries what was not applied.
	s.status, s.answer, s.retryAfter = http.StatusServiceUnavailable, `{"error":"raft leadership is moving; retry"}`, "1"
	if _, _, err := writeTo(l, s.addr(), http.MethodPut, "/v1/datasets/ds", nil, nil, 5*time.Second); !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable || !e.Retry {
		t.Fatalf("a 503 with Retry-After: %v", err)
	}
	s.retryAfter = ""
	s.status, s.answer = http.StatusBadGateway, "upstream broke"
	if _, _, err := writeTo(l, s.addr(), http.MethodGet, "/", nil, nil, 5*time.Second); !errors.As(err, &e) || e.Status != http.StatusBadGateway || e.Message != "upstream broke" {
		t.Fatalf("plain-text refusal: %v", err)
	}
	s.status, s.answer = http.StatusMultipleChoices, `{"error":""}`
	if _, _, err := writeTo(l, s.addr(), http.MethodGet, "/", nil, nil, 5*time.Second); !errors.As(err, &e) || e.Status != http.StatusMultipleChoices || e.Message != `{"error":""}` {
		t.Fatalf("3xx with an empty message: %v", err)
	}
	s.status, s.answer = http.StatusOK, "not json"
	var out api.Job
	if code, _, err := writeTo(l, s.addr(), http.MethodGet, "/", nil, &out, 5*time.Second); err == nil || errors.As(err, &e) || code != http.StatusOK {
		t.Fatalf("undecodable answer: %d, %v", code, err)
	}
	if _, _, err := writeTo(l, testutil.FreeAddr(t), http.MethodGet, "/", nil, nil, 5*time.Second); !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable {
		t.Fatalf("no leader listening: %v", err)
	}
	if _, _, err := writeTo(l, s.addr(), http.MethodPut, "/", func() {}, nil, 5*time.Second); err == nil {
		t.Fatal("a body that is not JSON was relayed")
	}
}

// has asks the leader whether it answers 200, as this node.
func TestLeaderHas(t *testing.T) {
	s := newLeaderStub(t)
	l := relay.New("n2", "tok")
	if !answersOK(l, s.addr(), "/v1/datasets/ds") || s.method != http.MethodGet || s.path != "/v1/datasets/ds" || s.auth != "Bearer tok" {
		t.Fatalf("has: saw %s %s %q", s.method, s.path, s.auth)
	}
	s.status = http.StatusNotFound
	if answersOK(l, s.addr(), "/v1/datasets/ds") {
		t.Fatal("a 404 counted as having it")
	}
	if answersOK(l, testutil.FreeAddr(t), "/") {
		t.Fatal("no answer counted as having it")
	}
}

// A read relayed to the leader goes as the client sent it (its method, path
// and credentials), marked relayed, and the leader's answer comes back whole.
func TestProxyCarriesTheClientsRequest(t *testing.T) {
	s := newLeaderStub(t)
	s.status, s.answer = http.StatusOK, `{"name":"ds"}`
	in, out := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(in)
	defer fasthttp.ReleaseResponse(out)
	in.Header.SetMethod(http.MethodGet)
	in.SetRequestURI("http://follower/v1/datasets/ds")
	in.Header.Set("Authorization", "Bearer client")
	if err := proxyTo(relay.New("n2", "node-token"), s.addr(), in, out); err != nil {
		t.Fatal(err)
	}
	if s.method != http.MethodGet || s.path != "/v1/datasets/ds" || s.auth != "Bearer client" || s.forwarded != "n2" {
		t.Fatalf("leader saw %s %s, authorization %q, forwarded %q", s.method, s.path, s.auth, s.forwarded)
	}
	if out.StatusCode() != http.StatusOK || string(out.Body()) != `{"name":"ds"}` {
		t.Fatalf("answer %d %q", out.StatusCode(), out.Body())
	}
	if err := proxyTo(relay.New("n2", ""), testutil.FreeAddr(t), in, out); err == nil {
		t.Fatal("no leader listening, yet an answer")
	}
}

// A node that knows no leader refuses writes at once with a 503, and a
// request relayed to it is never relayed again.
func TestWritesWithoutALeader(t *testing.T) {
	cat, err := catalog.Open(catalog.Config{Key: testutil.ClusterKey(), NodeID: "f1", Bind: testutil.FreeAddr(t), Dir: t.TempDir(), Timing: catalog.LocalTiming(), Logger: testutil.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer cat.Close()
	c := New(Config{Name: "f1", Logger: testutil.Discard()}, cat, lone{"f1"})
	ctx := context.Background()
	var e *api.Error
	if c.IsLeader() || c.LeaderHTTP() != "" {
		t.Fatal("a node never bootstrapped leads")
	}
	if _, err := c.PutJob(ctx, api.Job{Name: "j", Dataset: "ds", Seed: 1, WorldSize: 1, BatchSize: 1}); !errors.As(err, &e) ||
		e.Status != http.StatusServiceUnavailable || !strings.Contains(e.Message, "no raft leader") || !e.Retry {
		t.Fatalf("PutJob: %v (retry: %v)", err, e != nil && e.Retry)
	}
	if err := c.DeleteJob(Relayed(ctx), "j"); !errors.As(err, &e) || !strings.Contains(e.Message, "leadership is moving") || !e.Retry {
		t.Fatalf("relayed DeleteJob: %v", err)
	}
	if err := c.DeleteDataset(ctx, "ds"); !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable {
		t.Fatalf("DeleteDataset: %v", err)
	}
	if _, _, err := c.PutDataset(ctx, "ds", t.TempDir()); !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable {
		t.Fatalf("PutDataset: %v", err)
	}
	if err := c.PinEpoch(ctx, "j", 0); !errors.As(err, &e) || e.Status != http.StatusServiceUnavailable {
		t.Fatalf("PinEpoch: %v", err)
	}
	start := time.Now()
	if addr := c.AwaitLeader(ctx); addr != "" {
		t.Fatalf("AwaitLeader: %q", addr)
	}
	if waited := time.Since(start); waited < followerGrace {
		t.Fatalf("AwaitLeader gave up after %v, before its grace", waited)
	}
}

// A relayed write's index counts as applied once this node is at it, not
// only past it; waiting for one ahead gives up at the caller's deadline.
func TestAwaitApplied(t *testing.T) {
	c := openLeader(t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte("a"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.PutDataset(context.Background(), "ds", dir); err != nil { // a write: an index past 0
		t.Fatal(err)
	}
	done, cancel := context.WithCancel(context.Background())
	cancel() // nothing to wait for: the answer must not need a wait
	at := c.AppliedIndex()
	if !c.awaitApplied(done, at) || !c.awaitApplied(done, at-1) {
		t.Fatalf("index %d (applied) not counted as applied", at)
	}
	if c.awaitApplied(done, at+1) {
		t.Fatalf("index %d counted as applied at %d", at+1, at)
	}
}

// addrs is a cluster whose members' HTTP addresses are known.
type addrs map[string]string

func (a addrs) Members() []string {
	out := []string{}
	for m := range a {
		out = append(out, m)
	}
	return out
}
func (a addrs) HTTPAddr(m string) (string, bool) { s, ok := a[m]; return s, ok }

// A follower's catch-up target is the applied index the leader's API
// reports; an answer without one, or a refusal, is no target. A leader is
// its own target: its last index, asked of nobody.
func TestCatchupTargetFromTheLeader(t *testing.T) {
	l := openLeader(t)
	s := newLeaderStub(t)
	bind := testutil.FreeAddr(t)
	fcat, err := catalog.Open(catalog.Config{Key: testutil.ClusterKey(), NodeID: "f1", Bind: bind, Dir: t.TempDir(), Timing: catalog.LocalTiming(), Logger: testutil.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fcat.Close() })
	if err := l.cat.AddServer("f1", bind, false); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "f1 to hear from the leader", func() bool { return fcat.Leader() == "n1" })
	f := New(Config{Name: "f1", Logger: testutil.Discard()}, fcat, addrs{"n1": s.addr()})
	if f.LeaderHTTP() != s.addr() || f.AwaitLeader(context.Background()) != s.addr() {
		t.Fatalf("the follower finds the leader at %q", f.LeaderHTTP())
	}
	// Whether the leader knows a dataset (how long a follower waits for
	// it): asked of the leader, as the stub answers.
	s.status, s.answer = http.StatusOK, `{"name":"ds"}`
	if !f.leaderHasDataset(context.Background(), "ds") || s.path != "/v1/datasets/ds" {
		t.Fatalf("a leader answering 200 for ds: not counted as having it (it saw %s)", s.path)
	}
	s.status = http.StatusNotFound
	if f.leaderHasDataset(context.Background(), "ds") {
		t.Fatal("a leader answering 404 counted as having it")
	}
	s.status, s.answer = http.StatusOK, ""
	src := catchupSource{f}
	if _, ok := src.LocalTarget(); ok {
		t.Fatal("a follower has a local target")
	}
	s.applied = "42"
	if got, err := src.Target(context.Background()); err != nil || got != 42 || s.method != http.MethodGet || s.path != "/v1/cluster" {
		t.Fatalf("target %d, %v (the leader saw %s %s)", got, err, s.method, s.path)
	}
	s.applied = ""
	if _, err := src.Target(context.Background()); err == nil || !strings.Contains(err.Error(), "did not say") {
		t.Fatalf("an answer without an index: %v", err)
	}
	s.applied, s.status = "42", http.StatusInternalServerError
	if got, err := src.Target(context.Background()); err == nil {
		t.Fatalf("a refusal gave target %d", got)
	}
	// A read the leader answered for this follower is counted (the node's
	// relayed_reads_total).
	s.status, s.answer = http.StatusOK, `{"name":"ds"}`
	relayed := 0
	counted := New(Config{Name: "f1", Logger: testutil.Discard(), RelayedRead: func() { relayed++ }}, fcat, addrs{"n1": s.addr()})
	in, out := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(in)
	defer fasthttp.ReleaseResponse(out)
	in.Header.SetMethod(http.MethodGet)
	in.SetRequestURI("http://f1/v1/datasets/ds")
	if !counted.ReadFromLeader(in, out) || relayed != 1 || string(out.Body()) != `{"name":"ds"}` {
		t.Fatalf("a relayed read: counted %d, answer %q", relayed, out.Body())
	}
	if !f.ReadFromLeader(in, out) { // no counter: nothing to call
		t.Fatal("a relayed read without a counter")
	}
	own, ok := catchupSource{l}.LocalTarget()
	if got, err := (catchupSource{l}).Target(context.Background()); !ok || err != nil || got != own || got != l.cat.LastIndex() {
		t.Fatalf("the leader's target %d (%v), local %d", got, err, own)
	}
}
