package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
	"stallfree/internal/testutil"
	"stallfree/node"
)

// harness is a real node serving real HTTP on a loopback port.
type harness struct {
	t     testing.TB
	node  *node.Node
	base  string
	token string
	data  string
	files map[string][]byte
	keys  []string // manifest order
}

// writeDataset creates n files with awkward but valid names and random bytes.
func writeDataset(t testing.TB, n, size int) (string, map[string][]byte) {
	t.Helper()
	r := rand.New(rand.NewPCG(uint64(n), uint64(size)))
	return writeFiles(t, n, func() int { return size/2 + r.IntN(size) })
}

// writeFiles creates n files whose sizes sizeOf draws.
func writeFiles(t testing.TB, n int, sizeOf func() int) (string, map[string][]byte) {
	t.Helper()
	files := map[string][]byte{}
	r := rand.New(rand.NewPCG(uint64(n), 1))
	names := []string{"with space.bin", "ünï/cøde.bin", "pct%25.bin", "q?mark.bin", "hash#.bin", "..dots.bin"}
	for i := range n {
		key := fmt.Sprintf("class%02d/img_%05d.bin", i%7, i)
		if i < len(names) {
			key = names[i]
		}
		b := make([]byte, sizeOf())
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		files[key] = b
	}
	return testutil.WriteTree(t, files), files
}

func start(t testing.TB, items, size int, memory uint64, policy, token string) *harness {
	t.Helper()
	dir, files := writeDataset(t, items, size)
	return startOn(t, dir, files, memory, policy, token)
}

// startOn serves an existing dataset directory.
// opts configure the server before it serves.
func startOn(t testing.TB, dir string, files map[string][]byte, memory uint64, policy, token string, opts ...func(*Server, *node.Node)) *harness {
	t.Helper()
	n, err := node.New(node.Config{Name: "t1", ClusterKey: testutil.ClusterKey(), RaftBind: testutil.FreeAddr(t), DataDir: t.TempDir(), Bootstrap: true,
		Memory: memory, Policy: policy, Timing: node.LocalTiming(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := New(n, token, slog.New(slog.DiscardHandler))
	for _, o := range opts {
		o(srv, n)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		http.DefaultClient.CloseIdleConnections() // a spare dialed connection would hold Shutdown 5 s (main_test.go)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		n.Close()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.Control().RegisterAtStart(ctx, []string{"ds=" + dir}); err != nil {
		t.Fatal(err)
	}
	h := &harness{t: t, node: n, base: "http://" + ln.Addr().String(), token: token, data: dir, files: files}
	d, err := n.Control().Dataset(ctx, "ds")
	if err != nil {
		t.Fatal(err)
	}
	for i := range d.Manifest.Len() {
		h.keys = append(h.keys, d.Manifest.Key(i))
	}
	return h
}

type reply struct {
	status int
	header http.Header
	body   []byte
}

func (h *harness) do(method, path string, body []byte, hdr ...string) reply {
	h.t.Helper()
	req, err := http.NewRequest(method, h.base+path, bytes.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if h.token != "" {
		req.Header.Set("Authorization", "Bearer "+h.token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		h.t.Fatal(err)
	}
	return reply{resp.StatusCode, resp.Header, b}
}

// raw sends a request line exactly as given, bypassing Go's URL cleaning.
func (h *harness) raw(method, target string, body string) int {
	h.t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
	if err != nil {
		h.t.Fatal(err)
	}
	defer c.Close()
	auth := ""
	if h.token != "" {
		auth = "Authorization: Bearer " + h.token + "\r\n"
	}
	fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n%s", method, target, auth, len(body), body)
	resp, err := http.ReadResponse(bufioReader(c), nil)
	if err != nil {
		h.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

func (h *harness) stats() api.Stats {
	h.t.Helper()
	var s api.Stats
	r := h.do("GET", "/v1/stats", nil)
	if err := json.Unmarshal(r.body, &s); err != nil {
		h.t.Fatalf("stats: %v %s", err, r.body)
	}
	return s
}

func escapeKey(k string) string {
	segs := strings.Split(k, "/")
	for i, s := range segs {
		segs[i] = urlPathEscape(s)
	}
	return strings.Join(segs, "/")
}

func TestItemsByteExactThenAllHits(t *testing.T) {
	h := start(t, 60, 20000, 64<<20, "minio", "")
	for pass, want := range []string{"miss", "hit"} {
		for i, key := range h.keys {
			r := h.do("GET", "/v1/datasets/ds/items/"+escapeKey(key), nil)
			if r.status != 200 || !bytes.Equal(r.body, h.files[key]) {
				t.Fatalf("pass %d key %q: status %d, %d bytes, equal=%v", pass, key, r.status, len(r.body), bytes.Equal(r.body, h.files[key]))
			}
			if got := r.header.Get("X-Cache"); got != want {
				t.Fatalf("pass %d key %q: X-Cache %q, want %q", pass, key, got, want)
			}
			if r.header.Get("ETag") == "" {
				t.Fatal("no ETag")
			}
			r = h.do("GET", fmt.Sprintf("/v1/datasets/ds/index/%d", i), nil)
			if r.status != 200 || !bytes.Equal(r.body, h.files[key]) || r.header.Get("X-Key") != key {
				t.Fatalf("index %d: status %d X-Key %q", i, r.status, r.header.Get("X-Key"))
			}
		}
	}
	s := h.stats()
	if s.SourceReads != uint64(len(h.keys)) || s.ItemsCached != len(h.keys) {
		t.Fatalf("want one storage read per item: %+v", s)
	}
	if s.HitsLocal != uint64(3*len(h.keys)) || s.Misses != uint64(len(h.keys)) {
		t.Fatalf("hit/miss counts: %+v", s)
	}
}

func TestBatchInRequestOrder(t *testing.T) {
	h := start(t, 30, 5000, 64<<20, "minio", "")
	idx := []int{5, 0, 29, 5}
	body, _ := json.Marshal(map[string]any{"indices": idx})
	r := h.do("POST", "/v1/datasets/ds/batch", body)
	if r.status != 200 || r.header.Get("Content-Type") != "application/msgpack" {
		t.Fatalf("batch: %d %s", r.status, r.body)
	}
	var items []struct {
		Key  string `msgpack:"key"`
		Data []byte `msgpack:"data"`
	}
	if err := msgpack.Unmarshal(r.body, &items); err != nil {
		t.Fatal(err)
	}
	if len(items) != len(idx) {
		t.Fatalf("%d items", len(items))
	}
	for j, i := range idx {
		if items[j].Key != h.keys[i] || !bytes.Equal(items[j].Data, h.files[h.keys[i]]) {
			t.Fatalf("item %d differs", j)
		}
	}
	body, _ = json.Marshal(map[string]any{"keys": []string{h.keys[3], h.keys[1]}})
	r = h.do("POST", "/v1/datasets/ds/batch", body)
	if err := msgpack.Unmarshal(r.body, &items); err != nil || items[0].Key != h.keys[3] || !bytes.Equal(items[1].Data, h.files[h.keys[1]]) {
		t.Fatalf("batch by keys: %v", err)
	}
	if s := h.stats(); s.SourceReads != 5 {
		t.Fatalf("source reads %d, want 5 (3 distinct in the first batch, 2 in the second)", s.SourceReads)
	}
}

// epochReads reads the dataset in a fresh random order and returns how many
// storage reads that epoch cost.
func (h *harness) epochReads(seed uint64) uint64 {
	before := h.stats().SourceReads
	for _, i := range rand.New(rand.NewPCG(seed, 9)).Perm(len(h.keys)) {
		r := h.do("GET", fmt.Sprintf("/v1/datasets/ds/index/%d", i), nil)
		if r.status != 200 || !bytes.Equal(r.body, h.files[h.keys[i]]) {
			h.t.Fatalf("item %d: %d", i, r.status)
		}
	}
	return h.stats().SourceReads - before
}

func TestMinIOReadsHalfLRUReadsMore(t *testing.T) {
	testutil.Long(t)
	const items, size = 400, 8192 // fixed 8 KiB items (size/2 + rand(size) below)
	var total int
	_, files := writeDataset(t, items, size)
	for _, b := range files {
		total += len(b) + 64 + 128
	}
	half := uint64(total / 2)
	reads := map[string][]uint64{}
	for _, pol := range []string{"minio", "lru"} {
		h := start(t, items, size, half, pol, "")
		for e := range 4 {
			reads[pol] = append(reads[pol], h.epochReads(uint64(e)))
		}
	}
	t.Logf("storage reads per epoch, memory = half the dataset: %v", reads)
	for e := 1; e < 4; e++ {
		m, l := reads["minio"][e], reads["lru"][e]
		if m < items*40/100 || m > items*60/100 {
			t.Errorf("epoch %d: MinIO read %d of %d items, want about half", e, m, items)
		}
		if l <= m {
			t.Errorf("epoch %d: LRU read %d, MinIO %d: LRU should read more", e, l, m)
		}
	}
}

func TestBadInputChangesNothing(t *testing.T) {
	h := start(t, 10, 1000, 64<<20, "minio", "sekrit")
	if r := h.do("PUT", "/v1/jobs/j", []byte(`{"dataset":"ds","seed":1,"world_size":2,"batch_size":4}`)); r.status != 200 {
		t.Fatalf("job: %d %s", r.status, r.body)
	}
	dsBefore := h.do("GET", "/v1/datasets", nil).body
	jobsBefore := h.do("GET", "/v1/jobs", nil).body
	big := bytes.Repeat([]byte(" "), MaxBodySize+10)
	cases := []struct {
		method, target, body string
		want                 int
	}{
		{"GET", "/v1/datasets/nope", "", 404},
		{"GET", "/v1/datasets/nope/items/a", "", 404},
		{"GET", "/v1/datasets/ds/items/no/such/key", "", 404},
		{"GET", "/v1/datasets/ds/items/class01/../with%20space.bin", "", 400},
		{"GET", "/v1/datasets/ds/items/../../../etc/passwd", "", 400},
		{"GET", "/v1/datasets/ds/items/%2e%2e/%2e%2e/etc/passwd", "", 400},
		{"GET", "/v1/datasets/ds/items/a%2F..%2F..%2Fx", "", 400},
		{"GET", "/v1/datasets/ds/items//etc/passwd", "", 400},
		{"GET", "/v1/datasets/ds/items/%2Fetc%2Fpasswd", "", 400},
		{"GET", "/v1/datasets/ds/items/a%00b", "", 400},
		{"GET", "/v1/datasets/ds/items/a%0D%0AX-Evil:%201", "", 400},
		{"GET", "/v1/datasets/ds/items/%ff%fe", "", 400},
		{"GET", "/v1/datasets/ds/items/bad%zzescape", "", 400},
		{"GET", "/v1/datasets/ds/index/-1", "", 400},
		{"GET", "/v1/datasets/ds/index/10", "", 400},
		{"GET", "/v1/datasets/ds/index/99999999999999999999", "", 400},
		{"GET", "/v1/datasets/ds/index/abc", "", 400},
		{"POST", "/v1/datasets/ds/batch", `{"indices":[0,-1]}`, 400},
		{"POST", "/v1/datasets/ds/batch", `{"indices":[0,10]}`, 400},
		{"POST", "/v1/datasets/ds/batch", `{"indices":[0],"keys":["a"]}`, 400},
		{"POST", "/v1/datasets/ds/batch", `{"indices":`, 400},
		{"POST", "/v1/datasets/ds/batch", `{"indexes":[1]}`, 400},
		{"POST", "/v1/datasets/ds/batch", `{"keys":["nope"]}`, 404},
		{"PUT", "/v1/datasets/x", `{"source":`, 400},
		{"PUT", "/v1/datasets/x", `{"source":"/definitely/not/here"}`, 400},
		{"PUT", "/v1/datasets/x", `{"source":"gs://bucket"}`, 400},
		{"PUT", "/v1/datasets/x", `{"source":"s3://No_Such..Bucket"}`, 400},
		{"PUT", "/v1/datasets/ds", `{"source":"/tmp"}`, 409},
		{"PUT", "/v1/datasets/..", `{"source":"/tmp"}`, 400},
		{"PUT", "/v1/datasets/a%00b", `{"source":"/tmp"}`, 400},
		{"PUT", "/v1/jobs/j", `{"dataset":"ds","world_size":0,"batch_size":1}`, 400},
		{"PUT", "/v1/jobs/j", `{"dataset":"nope","world_size":1,"batch_size":1}`, 404},
		{"DELETE", "/v1/datasets/nope", "", 404},
		{"GET", "/v1/jobs/nope/epochs/0/ranks/0", "", 404},
		{"GET", "/v1/jobs/j/epochs/-1/ranks/0", "", 400},
		{"GET", "/v1/jobs/j/epochs/x/ranks/0", "", 400},
		{"GET", "/v1/jobs/j/epochs/99999999999999/ranks/0", "", 400},
		{"GET", "/v1/jobs/j/epochs/0/ranks/2", "", 400},
		{"GET", "/v1/jobs/j/epochs/0/ranks/-1", "", 400},
		{"GET", "/v1/jobs/j/epochs/0/ranks/0/batches/99", "", 400},
		{"GET", "/v1/jobs/j/epochs/0/ranks/0/batches/-1", "", 400},
		{"PUT", "/v1/jobs/k", `{"dataset":"ds","world_size":2,"batch_size":4,"ranks":["a"]}`, 400},
		{"PUT", "/v1/jobs/k", `{"dataset":"ds","world_size":1,"batch_size":4,"bogus":1}`, 400},
		{"GET", "/v1/datasets/ds/index/0?cache=sometimes", "", 400},
		{"GET", "/v1/jobs/j/epochs/0/ranks/0?from_generation=x&position=1", "", 400},
		{"GET", "/v1/jobs/j/epochs/0/ranks/0?from_generation=1&position=-1", "", 400},
		{"GET", "/v1/jobs/j/epochs/0/ranks/0?from_generation=1", "", 400},
		{"GET", "/v1/jobs/j/epochs/0/ranks/0?from_generation=1&position=0", "", 409},
		{"POST", "/v1/jobs/j/ranks/x/position", `{"epoch":0,"position":1}`, 400},
		{"POST", "/v1/jobs/j/ranks/0/position", `{"epoch":0,"position":-1}`, 400},
		{"POST", "/v1/jobs/j/ranks/0/position", `{"epoch":0,"position":1,"bogus":1}`, 400},
		{"POST", "/v1/jobs/j/ranks/99999999/position", `{"epoch":0,"position":1}`, 400},
		{"POST", "/v1/jobs/nope/ranks/0/position", `{"epoch":0,"position":1}`, 404},
		{"POST", "/v1/loader/wait", `{"seconds":-5}`, 400},
		{"GET", "/v1/nothing", "", 404},
		{"PATCH", "/v1/datasets/ds", "", 405},
	}
	for _, c := range cases {
		if got := h.raw(c.method, c.target, c.body); got != c.want {
			t.Errorf("%s %s %q: status %d, want %d", c.method, c.target, c.body, got, c.want)
		}
	}
	if got := h.raw("POST", "/v1/datasets/ds/batch", string(big)); got != 413 {
		t.Errorf("oversized body: %d, want 413", got)
	}
	if r := h.do("GET", "/v1/stats", nil, "Authorization", "Bearer wrong"); r.status != 401 {
		t.Errorf("wrong token: %d", r.status)
	}
	h.token = ""
	if r := h.do("GET", "/v1/datasets", nil); r.status != 401 {
		t.Errorf("no token: %d", r.status)
	}
	if r := h.do("GET", "/healthz", nil); r.status != 200 {
		t.Errorf("healthz after bad input: %d", r.status)
	}
	h.token = "sekrit"
	if got := h.do("GET", "/v1/datasets", nil).body; !bytes.Equal(got, dsBefore) {
		t.Errorf("catalog changed: %s -> %s", dsBefore, got)
	}
	if got := h.do("GET", "/v1/jobs", nil).body; !bytes.Equal(got, jobsBefore) {
		t.Errorf("jobs changed: %s -> %s", jobsBefore, got)
	}
	if s := h.stats(); s.ItemsCached != 0 || s.SourceReads != 0 {
		t.Errorf("bad input touched the store: %+v", s)
	}
	if got := h.do("GET", "/v1/jobs/j/positions", nil).body; string(got) != "[]" {
		t.Errorf("refused position reports were kept: %s", got)
	}
}

func TestAllowSource(t *testing.T) {
	dir, _ := writeDataset(t, 3, 100)
	other, _ := writeDataset(t, 3, 100)
	n, err := node.New(node.Config{Name: "t1", ClusterKey: testutil.ClusterKey(), RaftBind: testutil.FreeAddr(t), DataDir: t.TempDir(), Bootstrap: true,
		Memory: 1 << 20, Timing: node.LocalTiming(), AllowSources: []string{dir}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := n.Control().CheckSource(dir + "/"); err != nil {
		t.Errorf("inside prefix refused: %v", err)
	}
	if _, err := n.Control().CheckSource(other); err == nil {
		t.Error("outside prefix accepted")
	}
	if _, err := n.Control().CheckSource(dir + "x"); err == nil {
		t.Error("sibling with the same prefix accepted")
	}
	if code, _, _ := status(func() error { _, err := n.Control().CheckSource(other); return err }()); code != 403 {
		t.Error("forbidden source is not 403")
	}
}

func TestWarmupLoadsEverything(t *testing.T) {
	h := start(t, 50, 4000, 64<<20, "minio", "")
	if r := h.do("POST", "/v1/datasets/ds/warmup", nil); r.status != 202 {
		t.Fatalf("start: %d %s", r.status, r.body)
	}
	deadline := time.Now().Add(30 * time.Second)
	var p api.Progress
	for {
		json.Unmarshal(h.do("GET", "/v1/datasets/ds/warmup", nil).body, &p)
		if !p.Running || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	var total int64
	for _, b := range h.files {
		total += int64(len(b))
	}
	if p.Done != 50 || p.Total != 50 || p.Bytes != total || p.Error != "" {
		t.Fatalf("progress %+v, want 50/50 and %d bytes", p, total)
	}
	if s := h.stats(); s.ItemsCached != 50 || s.SourceReads != 50 {
		t.Fatalf("after warm-up: %+v", s)
	}
}

func TestPanicIsContained(t *testing.T) {
	h := start(t, 1, 10, 1<<20, "minio", "")
	s := New(h.node, "", slog.New(slog.DiscardHandler))
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	s.srv.Handler = s.recovering(func(*fastCtx) { panic("boom") })
	go s.Serve(ln)
	defer s.Shutdown(context.Background())
	resp, err := http.Get("http://" + ln.Addr().String() + "/v1/stats")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 500 {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if r := h.do("GET", "/healthz", nil); r.status != 200 {
		t.Fatal("process unhealthy after a panic")
	}
}

// A connection dialled and never used must be closed on timeout without a
// response: clients read a response there as unsolicited.
func TestUnusedConnectionClosedSilently(t *testing.T) {
	h := start(t, 1, 10, 1<<20, "minio", "")
	s := New(h.node, "", slog.New(slog.DiscardHandler))
	s.IdleTimeout = 100 * time.Millisecond
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	go s.Serve(ln)
	defer s.Shutdown(context.Background())
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, err := io.ReadAll(c)
	if err != nil || len(got) != 0 {
		t.Fatalf("idle connection got %q, %v; want a clean close", got, err)
	}
	// A half-sent request is still answered when it is malformed.
	c2, _ := net.Dial("tcp", ln.Addr().String())
	defer c2.Close()
	c2.Write([]byte("BOGUS\r\n\r\n"))
	c2.SetReadDeadline(time.Now().Add(10 * time.Second))
	got, _ = io.ReadAll(c2)
	if !bytes.HasPrefix(got, []byte("HTTP/1.1 400")) {
		t.Fatalf("malformed request got %q", got)
	}
}

func FuzzKeyPath(f *testing.F) {
	for _, s := range []string{"a/b", "a/../b", "%2e%2e/x", "a%00", "%ff", "/abs", "a%2Fb", "ok%20file"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		// The key is the tail of the path, taken from it as sent.
		p, seg := splitPath([]byte("/v1/datasets/ds/items/"+raw), nil)
		if want := strings.Split(p, "/"); !slices.Equal(seg, want) {
			t.Fatalf("%q: segments %q, want %q", raw, seg, want)
		}
		if len(seg) < 5 {
			return // a '?' cut the key off
		}
		tail := lastSegments(p, seg[4:])
		if want := strings.Join(seg[4:], "/"); tail != want {
			t.Fatalf("%q: key text %q, want %q", raw, tail, want)
		}
		key, err := decodeKey(tail)
		if err != nil {
			return
		}
		for seg := range strings.SplitSeq(key, "/") {
			if seg == "" || seg == "." || seg == ".." {
				t.Fatalf("%q decoded to unsafe key %q", raw, key)
			}
		}
		if strings.ContainsRune(key, 0) || strings.HasPrefix(key, "/") {
			t.Fatalf("%q decoded to unsafe key %q", raw, key)
		}
	})
}

// A job read refused for its rank or batch pins nothing: the attack round
// asked epoch 1000000 of a new job with rank 99, got 400, and epoch 0 was
// "over" from then on.
func TestRefusedJobReadsPinNothing(t *testing.T) {
	h := start(t, 10, 10, 1<<20, "lru", "")
	if r := h.do("PUT", "/v1/jobs/fresh", []byte(`{"dataset":"ds","seed":7,"world_size":2,"batch_size":2}`)); r.status/100 != 2 {
		t.Fatalf("job: %d %s", r.status, r.body)
	}
	for _, target := range []string{
		"/v1/jobs/fresh/epochs/1000000/ranks/99",
		"/v1/jobs/fresh/epochs/1000000/ranks/-1",
		"/v1/jobs/fresh/epochs/1000000/ranks/2/batches/0",
		"/v1/jobs/fresh/epochs/1000000/ranks/0/batches/3", // 10 items, 2 ranks of batch 2: batches 0..2
		"/v1/jobs/fresh/epochs/1000000/ranks/0/batches/-1",
		"/v1/jobs/fresh/epochs/1000000/ranks/99?from_generation=1&position=0", // the resumed order's route too
	} {
		if got := h.raw("GET", target, ""); got != 400 {
			t.Errorf("GET %s: %d, want 400", target, got)
		}
	}
	if got := h.raw("GET", "/v1/jobs/fresh/epochs/1000000/ranks/0?from_generation=999999&position=0", ""); got != 409 {
		t.Errorf("a resumed order of a generation the job never had: %d, want 409", got)
	}
	if r := h.do("GET", "/v1/jobs/fresh/epochs/0/ranks/1", nil); r.status != 200 {
		t.Fatalf("epoch 0 after the refused reads: %d %s", r.status, r.body)
	}
	if r := h.do("GET", "/v1/jobs/fresh/epochs/0/ranks/1/batches/2", nil); r.status != 200 {
		t.Fatalf("the last batch of epoch 0: %d %s", r.status, r.body)
	}
}
