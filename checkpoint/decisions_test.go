package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/internal/testutil"
	"stallfree/relay"
	"stallfree/source"
)

// The decisions of repair, persist, reads from other copies, relayed
// writes and cleanup, against a catalog the test sets (ckCatalog) and
// members that are HTTP stubs (peer).

// ckCatalog is a catalog whose checkpoints the test sets; it records the
// writes the service makes.
type ckCatalog struct {
	mu       sync.Mutex
	cks      []*catalog.Checkpoint
	leader   bool
	updated  chan struct{}
	holders  map[string][]catalog.CheckpointPart // "name/step" → parts given new holders
	holdErr  error
	marked   []string // "name/step" marked persisted
	deleted  []string
	commits  int
	markFail error
	waits    int // calls of Updated: the loops' looks
}

func newCkCatalog(leader bool, cks ...*catalog.Checkpoint) *ckCatalog {
	return &ckCatalog{cks: cks, leader: leader, updated: make(chan struct{}), holders: map[string][]catalog.CheckpointPart{}}
}

func (c *ckCatalog) set(cks ...*catalog.Checkpoint) {
	c.mu.Lock()
	c.cks = cks
	ch := c.updated
	c.updated = make(chan struct{})
	c.mu.Unlock()
	close(ch)
}

func (c *ckCatalog) Checkpoint(name string) (*catalog.Checkpoint, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, ck := range c.cks {
		if ck.Name == name {
			return ck, true
		}
	}
	return nil, false
}

func (c *ckCatalog) Checkpoints() []*catalog.Checkpoint {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.cks)
}

func (c *ckCatalog) CommitCheckpoint(string, uint64, []catalog.CheckpointPart, string, int) (*catalog.CheckpointStep, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.commits++
	return nil, errors.New("not in this fake")
}

func (c *ckCatalog) MarkCheckpointPersisted(name string, step, _ uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.markFail != nil {
		return c.markFail
	}
	c.marked = append(c.marked, stepKey(name, step))
	for _, ck := range c.cks {
		if ck.Name == name {
			for i, st := range ck.Steps {
				if st.Step == step {
					n := *st
					n.Persisted = true
					ck.Steps[i] = &n
				}
			}
		}
	}
	return nil
}

func (c *ckCatalog) SetCheckpointHolders(name string, step uint64, parts []catalog.CheckpointPart) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holdErr != nil {
		return c.holdErr
	}
	c.holders[stepKey(name, step)] = parts
	return nil
}

func (c *ckCatalog) DeleteCheckpoint(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.deleted = append(c.deleted, name)
	return nil
}

func (c *ckCatalog) IsLeader() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.leader
}

func (c *ckCatalog) Updated() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.waits++
	return c.updated
}

func (c *ckCatalog) looks() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waits
}

func (c *ckCatalog) WaitFor(ctx context.Context, cond func() bool) bool {
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-c.Updated():
		}
	}
	return true
}

func (c *ckCatalog) holdersOf(name string, step uint64) []catalog.CheckpointPart {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.holders[stepKey(name, step)]
}

// peer is a member's HTTP API as the service calls it: handle answers,
// every request is recorded (method, URI, body).
type peer struct {
	srv    *httptest.Server
	mu     sync.Mutex
	reqs   []string
	bodies map[string][]byte
	handle func(w http.ResponseWriter, r *http.Request, body []byte)
}

func newPeer(t *testing.T, handle func(w http.ResponseWriter, r *http.Request, body []byte)) *peer {
	p := &peer{bodies: map[string][]byte{}, handle: handle}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		p.mu.Lock()
		p.reqs = append(p.reqs, r.Method+" "+r.URL.RequestURI())
		p.bodies[r.Method+" "+r.URL.RequestURI()] = b
		p.mu.Unlock()
		p.handle(w, r, b)
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *peer) addr() string { return strings.TrimPrefix(p.srv.URL, "http://") }

func (p *peer) requests() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.reqs)
}

func (p *peer) body(req string) []byte {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bodies[req]
}

// servePart answers a GET of a part with b and its sum (hdr: the checksum
// header sent, "" for sum(b)), a PUT with 201, and a listing with held.
func servePart(b []byte, hdr string, held []HeldPart) func(http.ResponseWriter, *http.Request, []byte) {
	return func(w http.ResponseWriter, r *http.Request, _ []byte) {
		switch {
		case r.Method == http.MethodPut:
			w.WriteHeader(http.StatusCreated)
		case r.Method == http.MethodPost:
			w.WriteHeader(http.StatusNoContent)
		case strings.Contains(r.URL.Path, "/parts/"):
			if hdr == "" {
				hdr = sum(b)
			}
			w.Header().Set(api.HeaderChecksum, hdr)
			w.Header().Set("Content-Length", fmt.Sprint(len(b)))
			w.Write(b)
		default:
			json.NewEncoder(w).Encode(held)
		}
	}
}

// cluster is the live members: this node ("a", at selfAddr) and peers.
type cluster struct {
	mu       sync.Mutex
	live     []string
	addrs    map[string]string
	leaderAt string
}

func (c *cluster) Members() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Sorted(slices.Values(c.live))
}

func (c *cluster) MemberHTTP(m string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a, ok := c.addrs[m]
	return a, ok
}

func (c *cluster) LeaderHTTP() string { return c.leaderAt }

func newCluster(live []string, peers map[string]*peer) *cluster {
	c := &cluster{live: live, addrs: map[string]string{"a": "127.0.0.1:9"}}
	for n, p := range peers {
		c.addrs[n] = p.addr()
	}
	return c
}

func newDecisionService(t *testing.T, cat Catalog, members Members) *Service {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	s := &Service{cfg: Config{Self: "a", Keep: 2, DeadGrace: time.Hour, Tick: time.Millisecond}, cat: cat, members: members,
		mem: newMemory(1 << 20), log: testutil.Discard(), ctx: ctx, cancel: cancel, peers: relay.New("a", "")}
	t.Cleanup(s.mem.dropAll)
	return s
}

func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func ckOf(name string, steps ...*catalog.CheckpointStep) *catalog.Checkpoint {
	return &catalog.Checkpoint{Name: name, Steps: steps}
}

func partOf(name string, b []byte, holders ...string) catalog.CheckpointPart {
	return catalog.CheckpointPart{Name: name, Size: int64(len(b)), Sum: sum(b), Holders: holders}
}

func readAll(t *testing.T, p *Part) ([]byte, error) {
	t.Helper()
	defer p.Close()
	return io.ReadAll(p)
}

// A read of a part this node does not hold tries the live holders first,
// skips a copy of other bytes, fails a body that does not hash to the sum
// before its end, and falls back to the persisted copy only when no copy in
// memory answers and the persisted one has the committed size.
func TestOpenFromPeersThenThePersistedCopy(t *testing.T) {
	body := []byte("the committed part, byte for byte")
	other := []byte("another version of the part......")
	good := newPeer(t, servePart(body, "", nil))
	wrongSum := newPeer(t, servePart(other, "", nil))
	lying := newPeer(t, servePart(other, sum(body), nil)) // says the sum, sends other bytes
	cl := newCluster([]string{"a", "b", "c", "d"}, map[string]*peer{"b": wrongSum, "c": good, "d": lying})
	cl.addrs["e"] = lying.addr() // dead, but it would answer
	cat := newCkCatalog(true, ckOf("job", &catalog.CheckpointStep{Step: 1, Parts: []catalog.CheckpointPart{partOf("0", body, "e", "b", "c")}}))
	s := newDecisionService(t, cat, cl)
	ctx := bounded(t)

	p, err := s.Open(ctx, "job", 1, "0", false)
	if err != nil || p.From != "peer" || p.Size != int64(len(body)) || p.Sum != sum(body) {
		t.Fatalf("open: %+v %v", p, err)
	}
	if got, err := readAll(t, p); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("read %q %v", got, err)
	}
	if r := lying.requests(); len(r) != 0 {
		t.Fatalf("the dead holder was asked before the live ones: %v", r)
	}
	if r := wrongSum.requests(); len(r) != 1 {
		t.Fatalf("the holder of other bytes was asked %d times", len(r))
	}

	// Only a copy that lies about its bytes answers: the read fails before its end.
	cat.set(ckOf("job", &catalog.CheckpointStep{Step: 1, Parts: []catalog.CheckpointPart{partOf("0", body, "d")}}))
	p, err = s.Open(ctx, "job", 1, "0", false)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := readAll(t, p); !errors.Is(err, errSum) || bytes.Equal(got, other) {
		t.Fatalf("a wrong body read whole: %d bytes, %v", len(got), err)
	}

	// No copy answers: the persisted one, checked, when the step is persisted.
	root := t.TempDir()
	s.persist = dirBackend{root: root}
	gone := &catalog.CheckpointStep{Step: 1, Parts: []catalog.CheckpointPart{partOf("0", body, "x", "y")}}
	cat.set(ckOf("job", gone))
	if _, err := s.Open(ctx, "job", 1, "0", false); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("no copy answers, not persisted: %v", err)
	}
	persisted := *gone
	persisted.Persisted = true
	cat.set(ckOf("job", &persisted))
	if _, err := s.Open(ctx, "job", 1, "0", false); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("persisted, but the object is missing: %v", err)
	}
	if err := (dirBackend{root: root}).Put(ctx, objectKey("job", 1, "0"), bytes.NewReader(body[1:]), int64(len(body)-1)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Open(ctx, "job", 1, "0", false); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("a persisted object of another size: %v", err)
	}
	if err := (dirBackend{root: root}).Put(ctx, objectKey("job", 1, "0"), bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatal(err)
	}
	p, err = s.Open(ctx, "job", 1, "0", false)
	if err != nil || p.From != "persisted" {
		t.Fatalf("open: %+v %v", p, err)
	}
	if got, err := readAll(t, p); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("persisted read %q %v", got, err)
	}

	// A part the step lacks, a step not committed that nobody holds, and a
	// local-only read of what is not here are not found.
	if _, err := s.Open(ctx, "job", 1, "9", false); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("a part the step lacks: %v", err)
	}
	cl.mu.Lock()
	cl.live = []string{"a"}
	cl.mu.Unlock()
	if _, err := s.Open(ctx, "job", 2, "0", false); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("an uncommitted step nobody holds: %v", err)
	}
	if _, err := s.Open(ctx, "job", 1, "0", true); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("a local-only read of a part not here: %v", err)
	}
}

// An upload (no commit yet) is read from whichever member has it, trusting
// the sum it sends.
func TestOpenAnUploadFromAnyMember(t *testing.T) {
	body := []byte("an upload")
	b := newPeer(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { http.Error(w, "no", http.StatusNotFound) })
	c := newPeer(t, servePart(body, "", nil))
	s := newDecisionService(t, newCkCatalog(true), newCluster([]string{"a", "b", "c"}, map[string]*peer{"b": b, "c": c}))
	p, err := s.Open(bounded(t), "job", 4, "0", false)
	if err != nil || p.Sum != sum(body) {
		t.Fatalf("open: %+v %v", p, err)
	}
	if got, err := readAll(t, p); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("read %q %v", got, err)
	}
	if len(b.requests()) != 1 {
		t.Fatal("b was not asked first")
	}
}

// Repair waits DeadGrace for a dead holder, then copies the survivor's
// bytes to its partner among the members left; a part with two live
// holders, and steps older than the newest two, are left alone.
func TestRepairWaitsTheGraceAndCopiesFromARemoteSurvivor(t *testing.T) {
	body := []byte("part bytes")
	c := newPeer(t, servePart(body, "", []HeldPart{{Part: "0", Bytes: int64(len(body)), Sum: sum(body)}}))
	d := newPeer(t, servePart(nil, "", []HeldPart{{Part: "0", Bytes: int64(len(body)), Sum: sum(body)}}))
	old := &catalog.CheckpointStep{Step: 1, Version: 1, Parts: []catalog.CheckpointPart{partOf("0", body, "b", "c")}}
	mid := &catalog.CheckpointStep{Step: 2, Version: 2, Parts: []catalog.CheckpointPart{partOf("0", body, "c", "d")}}
	cur := &catalog.CheckpointStep{Step: 3, Version: 3, Parts: []catalog.CheckpointPart{partOf("0", body, "b", "c")}}
	cat := newCkCatalog(true, ckOf("job", old, mid, cur))
	cl := newCluster([]string{"a", "c", "d"}, map[string]*peer{"c": c, "d": d})
	s := newDecisionService(t, cat, cl)
	rs := newRepairState()
	s.repair(rs)
	s.repair(rs)
	if n := len(cat.holders); n != 0 || s.Stats().Rereplicated != 0 {
		t.Fatalf("repaired within the grace: %v", cat.holders)
	}
	since, ok := rs.deadSince["b"]
	if !ok {
		t.Fatal("b's death not noted")
	}
	rs.deadSince["b"] = since.Add(-s.cfg.DeadGrace) // the grace is over
	s.repair(rs)
	// c's partner among a, c, d (the last three form one group) is d.
	parts := cat.holdersOf("job", 3)
	if len(parts) != 1 || !slices.Equal(parts[0].Holders, []string{"c", "d"}) || parts[0].Sum != sum(body) {
		t.Fatalf("step 3 after repair: %+v", parts)
	}
	if cat.holdersOf("job", 1) != nil || cat.holdersOf("job", 2) != nil {
		t.Fatal("an older step, or a part with two live holders, was repaired")
	}
	want := "POST " + internalPath("job", 3, "/parts/0/copy?to="+d.addr())
	if !slices.Contains(c.requests(), want) {
		t.Fatalf("c was asked %v; want %s", c.requests(), want)
	}
	if s.Stats().Rereplicated != 1 {
		t.Fatalf("rereplicated %d", s.Stats().Rereplicated)
	}
	// A lone member repairs nothing.
	cl.mu.Lock()
	cl.live = []string{"a"}
	cl.mu.Unlock()
	cat.holders = map[string][]catalog.CheckpointPart{}
	s.repair(rs)
	if len(cat.holders) != 0 {
		t.Fatal("a lone member repaired")
	}
}

// A live holder that no longer has its copy (restarted empty) has lost it
// at once, with no grace: this node's copy goes to it again. A holder whose
// answer is not the committed sum counts as lost too; one that does not
// answer is left to the dead-member rule.
func TestRepairReplacesACopyALiveHolderLost(t *testing.T) {
	body := []byte("the committed part")
	var mu sync.Mutex
	var held []HeldPart
	b := newPeer(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		mu.Lock()
		defer mu.Unlock()
		servePart(nil, "", held)(w, r, nil)
	})
	cat := newCkCatalog(true)
	s := newDecisionService(t, cat, newCluster([]string{"a", "b"}, map[string]*peer{"b": b}))
	if err := putReplica(t, s, 5, "0", bytes.NewReader(body), body); err != nil {
		t.Fatal(err)
	}
	cat.set(ckOf("job", &catalog.CheckpointStep{Step: 5, Version: 1, Parts: []catalog.CheckpointPart{partOf("0", body, "a", "b")}}))
	held = []HeldPart{{Part: "0", Bytes: int64(len(body)), Sum: sum(body)}}
	rs := newRepairState()
	s.repair(rs)
	if len(cat.holders) != 0 {
		t.Fatal("repaired a part both holders have")
	}
	mu.Lock()
	held = []HeldPart{{Part: "0", Bytes: int64(len(body)), Sum: sum([]byte("other"))}}
	mu.Unlock()
	rs = newRepairState()
	s.repair(rs)
	parts := cat.holdersOf("job", 5)
	if len(parts) != 1 || !slices.Equal(parts[0].Holders, []string{"a", "b"}) {
		t.Fatalf("holders: %+v", parts)
	}
	put := "PUT " + internalPath("job", 5, "/parts/0?repair=1")
	if got := b.body(put); !bytes.Equal(got, body) {
		t.Fatalf("b received %q (requests %v)", got, b.requests())
	}
	if len(rs.missing) != 0 {
		t.Fatalf("still missing after the copy: %v", rs.missing)
	}
	// Verification runs every verifyEvery ticks, not on each.
	listings := func() int {
		n := 0
		for _, r := range b.requests() {
			if strings.HasPrefix(r, "GET ") {
				n++
			}
		}
		return n
	}
	n := listings()
	for range verifyEvery - 1 {
		s.repair(rs)
	}
	if got := listings(); got != n {
		t.Fatalf("%d listings in %d ticks after a verification", got-n, verifyEvery-1)
	}
	s.repair(rs)
	if got := listings(); got != n+1 {
		t.Fatalf("%d listings at the next verification; want 1", got-n)
	}
	// A failed record of the new holders counts nothing.
	cat.holdErr = errors.New("no quorum")
	mu.Lock()
	held = nil
	mu.Unlock()
	before := s.Stats().Rereplicated
	s.repair(newRepairState())
	if s.Stats().Rereplicated != before {
		t.Fatal("a repair whose holders were not recorded was counted")
	}
}

// With no copy left in memory, a persisted step's part is restored to a
// pair of live members (from the persisted copy); an unpersisted one
// cannot be.
func TestRepairRestoresFromThePersistedCopy(t *testing.T) {
	body := []byte("persisted bytes")
	holding := []HeldPart{{Part: "0", Bytes: int64(len(body)), Sum: sum(body)}}
	b, d, e := newPeer(t, servePart(nil, "", holding)), newPeer(t, servePart(nil, "", holding)), newPeer(t, servePart(nil, "", nil))
	st := &catalog.CheckpointStep{Step: 7, Version: 2, Parts: []catalog.CheckpointPart{partOf("0", body, "x", "y")}}
	cat := newCkCatalog(true, ckOf("job", st))
	cl := newCluster([]string{"a", "b", "d", "e"}, map[string]*peer{"b": b, "d": d, "e": e})
	s := newDecisionService(t, cat, cl)
	s.cfg.DeadGrace = time.Nanosecond
	root := t.TempDir()
	s.persist = dirBackend{root: root}
	rs := newRepairState()
	s.repair(rs)
	s.repair(rs)
	if len(cat.holders) != 0 {
		t.Fatal("restored a step that was never persisted")
	}
	if err := s.persist.Put(context.Background(), objectKey("job", 7, "0"), bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatal(err)
	}
	p := *st
	p.Persisted = true
	// A persisted step whose part both live holders have is left alone.
	kept := &catalog.CheckpointStep{Step: 1, Version: 2, Persisted: true, Parts: []catalog.CheckpointPart{partOf("0", body, "b", "d")}}
	if err := s.persist.Put(context.Background(), objectKey("kept", 1, "0"), bytes.NewReader(body), int64(len(body))); err != nil {
		t.Fatal(err)
	}
	cat.set(ckOf("job", &p), ckOf("kept", kept))
	s.repair(rs)
	if cat.holdersOf("kept", 1) != nil {
		t.Fatal("a part with two live copies was restored")
	}
	// Version 2 of 4 members picks d's pair: d and e.
	parts := cat.holdersOf("job", 7)
	if len(parts) != 1 || !slices.Equal(parts[0].Holders, []string{"d", "e"}) {
		t.Fatalf("holders: %+v", parts)
	}
	put := "PUT " + internalPath("job", 7, "/parts/0?repair=1")
	for n, m := range map[string]*peer{"d": d, "e": e} {
		if got := m.body(put); !bytes.Equal(got, body) {
			t.Fatalf("%s received %q", n, got)
		}
	}
	for _, r := range b.requests() {
		if strings.HasPrefix(r, "PUT ") {
			t.Fatalf("b, outside the pair, was sent a copy: %s", r)
		}
	}
}

// A step is persisted from a peer's copy when this node has none, part by
// part, then marked; oldest commit first; a failure marks nothing.
func TestPersistStepFromAPeerAndTheOrder(t *testing.T) {
	body := []byte("held by b only")
	b := newPeer(t, servePart(body, "", nil))
	newer := &catalog.CheckpointStep{Step: 9, Version: 5, Parts: []catalog.CheckpointPart{partOf("0", body, "b")}}
	older := &catalog.CheckpointStep{Step: 3, Version: 2, Parts: []catalog.CheckpointPart{partOf("0", body, "b")}}
	done := &catalog.CheckpointStep{Step: 1, Version: 1, Persisted: true}
	cat := newCkCatalog(true, ckOf("a-job", newer), ckOf("b-job", done, older))
	s := newDecisionService(t, cat, newCluster([]string{"a", "b"}, map[string]*peer{"b": b}))
	root := t.TempDir()
	s.persist = dirBackend{root: root}
	pending := s.unpersisted()
	if len(pending) != 2 || pending[0].step != older || pending[1].step != newer {
		t.Fatalf("pending: %+v", pending)
	}
	if err := s.persistStep("b-job", older); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(root, "b-job", "3", "0")); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("persisted %q %v", got, err)
	}
	if !slices.Equal(cat.marked, []string{"b-job/3"}) {
		t.Fatalf("marked %v", cat.marked)
	}
	// No copy in memory anywhere: nothing is persisted from the persisted store.
	missing := &catalog.CheckpointStep{Step: 4, Version: 6, Parts: []catalog.CheckpointPart{partOf("0", body, "x")}}
	cat.set(append(cat.Checkpoints(), ckOf("c-job", missing))...)
	if err := s.persistStep("c-job", missing); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("persisting a part nobody holds: %v", err)
	}
	if len(cat.marked) != 1 {
		t.Fatalf("marked %v", cat.marked)
	}
}

// failingBackend fails its first fail puts, then stores in memory.
type failingBackend struct {
	mu   sync.Mutex
	fail int
	puts int
	objs map[string][]byte
}

func (b *failingBackend) Put(_ context.Context, key string, r io.Reader, _ int64) error {
	data, err := io.ReadAll(r)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.puts++
	if b.puts <= b.fail {
		return errors.New("storage down")
	}
	if err != nil {
		return err
	}
	b.objs[key] = data
	return nil
}

func (b *failingBackend) Open(_ context.Context, key string) (io.ReadCloser, int64, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	d, ok := b.objs[key]
	if !ok {
		return nil, 0, os.ErrNotExist
	}
	return io.NopCloser(bytes.NewReader(d)), int64(len(d)), nil
}

func (b *failingBackend) String() string { return "fake://" }

// The leader's loop persists committed steps, retrying a failing store:
// the failures and the last error are counted, the step is marked once the
// store takes it, and the error is cleared. A follower persists nothing.
func TestLeaderLoopRetriesPersistence(t *testing.T) {
	body := []byte("to persist")
	cat := newCkCatalog(false)
	s := newDecisionService(t, cat, newCluster([]string{"a"}, nil))
	be := &failingBackend{fail: 2, objs: map[string][]byte{}}
	s.persist = be
	if err := putReplica(t, s, 2, "0", bytes.NewReader(body), body); err != nil {
		t.Fatal(err)
	}
	cat.set(ckOf("job", &catalog.CheckpointStep{Step: 2, Version: 1, Parts: []catalog.CheckpointPart{partOf("0", body, "a")}}))
	s.wg.Add(1)
	go s.leaderLoop()
	t.Cleanup(func() { s.cancel(); s.wg.Wait() })
	for range 3 { // follower ticks
		cat.set(cat.Checkpoints()...)
	}
	be.mu.Lock()
	puts := be.puts
	be.mu.Unlock()
	if puts != 0 || s.Stats().PersistPending != 0 {
		t.Fatalf("a follower persisted (%d puts)", puts)
	}
	cat.mu.Lock()
	cat.leader = true
	cat.mu.Unlock()
	testutil.Await(t, "the step persisted", func() bool { return s.Stats().PersistedSteps == 1 })
	st := s.Stats()
	if st.PersistFailures != 2 || st.PersistError != "" || st.PersistPending != 0 {
		t.Fatalf("stats after two failures and a success: %+v", st)
	}
	if !slices.Equal(cat.marked, []string{"job/2"}) || !bytes.Equal(be.objs["job/2/0"], body) {
		t.Fatalf("marked %v, stored %q", cat.marked, be.objs["job/2/0"])
	}
}

// A failure leaves its error in the stats and the step pending.
func TestPersistFailureIsReported(t *testing.T) {
	body := []byte("to persist")
	cat := newCkCatalog(true)
	s := newDecisionService(t, cat, newCluster([]string{"a"}, nil))
	s.cfg.Tick = time.Hour
	s.persist = &failingBackend{fail: 1 << 30, objs: map[string][]byte{}}
	if err := putReplica(t, s, 2, "0", bytes.NewReader(body), body); err != nil {
		t.Fatal(err)
	}
	s.wg.Add(1)
	go s.leaderLoop()
	t.Cleanup(func() { s.cancel(); s.wg.Wait() })
	ck := ckOf("job", &catalog.CheckpointStep{Step: 2, Version: 1, Parts: []catalog.CheckpointPart{partOf("0", body, "a")}})
	testutil.Await(t, "a failure counted", func() bool { cat.set(ck); return s.Stats().PersistFailures == 1 })
	st := s.Stats()
	if !strings.Contains(st.PersistError, "storage down") || st.PersistPending != 1 || st.PersistedSteps != 0 || st.Persist != "fake://" {
		t.Fatalf("stats: %+v", st)
	}
	// The next update comes within the backoff (a tick): no second try yet.
	cat.set(cat.Checkpoints()...)
	cat.set(cat.Checkpoints()...)
	if n := s.Stats().PersistFailures; n != 1 {
		t.Fatalf("%d tries within the backoff", n)
	}
}

// A follower relays a commit to the leader and returns once its own
// catalog shows it; the leader's 409 naming missing parts is a
// *MissingError; a request relayed once already, or with no leader known,
// is a 503 to retry.
func TestCommitRelayedToTheLeader(t *testing.T) {
	var answer func(w http.ResponseWriter)
	leader := newPeer(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) { answer(w) })
	cat := newCkCatalog(false)
	cl := newCluster([]string{"a", "l"}, map[string]*peer{"l": leader})
	cl.leaderAt = leader.addr()
	s := newDecisionService(t, cat, cl)
	ctx := bounded(t)
	req := api.CommitCheckpoint{Parts: []string{"0", "1"}}

	answer = func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusConflict)
		json.NewEncoder(w).Encode(api.MissingParts{Error: "missing", Missing: []string{"1"}})
	}
	_, err := s.Commit(ctx, "job", 3, req, false)
	var missing *MissingError
	if !errors.As(err, &missing) || !slices.Equal(missing.Parts, []string{"1"}) {
		t.Fatalf("the leader's 409: %v", err)
	}
	if got := leader.requests(); len(got) != 1 || got[0] != "POST /v1/checkpoints/job/steps/3/commit" {
		t.Fatalf("relayed as %v", got)
	}
	var sent api.CommitCheckpoint
	if err := json.Unmarshal(leader.body("POST /v1/checkpoints/job/steps/3/commit"), &sent); err != nil || !slices.Equal(sent.Parts, req.Parts) {
		t.Fatalf("relayed body %+v %v", sent, err)
	}

	answer = func(w http.ResponseWriter) { http.Error(w, "disk on fire", http.StatusInternalServerError) }
	if _, err := s.Commit(ctx, "job", 3, req, false); !isStatus(err, http.StatusInternalServerError) {
		t.Fatalf("the leader's 500: %v", err)
	}
	answer = func(w http.ResponseWriter) {
		w.WriteHeader(http.StatusServiceUnavailable)
		w.Write([]byte(`{"error":"no quorum"}`))
	}
	if _, err := s.Commit(ctx, "job", 3, req, false); !isStatus(err, http.StatusServiceUnavailable) {
		t.Fatalf("the leader's JSON 503 naming no parts: %v", err)
	}
	answer = func(w http.ResponseWriter) { w.WriteHeader(http.StatusMultipleChoices) }
	if _, err := s.Commit(ctx, "job", 3, req, false); !isStatus(err, http.StatusMultipleChoices) {
		t.Fatalf("the leader's 300: %v", err)
	}

	answer = func(w http.ResponseWriter) { // an answer without end: read up to the bound, then refused
		w.Write([]byte(`{"step":3,"meta":"`))
		chunk := bytes.Repeat([]byte("x"), 1<<20)
		for range leaderAnswerLimit>>20 + 2 {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	}
	if _, err := s.Commit(ctx, "job", 3, req, false); !isStatus(err, http.StatusBadGateway) {
		t.Fatalf("the leader's endless answer: %v", err)
	}
	if _, ok := cat.Checkpoint("job"); ok {
		t.Fatal("a refused answer waited for the commit")
	}
	answer = func(w http.ResponseWriter) {
		json.NewEncoder(w).Encode(api.CheckpointStep{Step: 3, Parts: []string{"0", "1"}, Replicas: 2})
		go cat.set(ckOf("job", &catalog.CheckpointStep{Step: 3, Version: 1}))
	}
	st, err := s.Commit(ctx, "job", 3, req, false)
	if err != nil || st.Step != 3 || st.Replicas != 2 {
		t.Fatalf("relayed commit: %+v %v", st, err)
	}
	if _, ok := cat.Checkpoint("job"); !ok {
		t.Fatal("returned before the local catalog showed the commit")
	}

	if _, err := s.Commit(ctx, "job", 3, req, true); !isStatus(err, http.StatusServiceUnavailable) {
		t.Fatalf("relayed twice: %v", err)
	}
	cl.leaderAt = ""
	if _, err := s.Commit(ctx, "job", 3, req, false); !isStatus(err, http.StatusServiceUnavailable) {
		t.Fatalf("no leader: %v", err)
	}
	if cat.commits != 0 {
		t.Fatal("a follower committed in its own catalog")
	}
}

// The largest answer a legitimate commit can have fits the bound on a
// relayed answer: a 1 MiB commit body of the shortest distinct part names
// (three letters: more than the 3,906 names of one or two), each named again
// in the answer's parts and checksums.
func TestTheLargestCommitAnswerFits(t *testing.T) {
	const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
	var req api.CommitCheckpoint
	var st api.CheckpointStep
	for i := range (1<<20 - 12) / 6 { // `"abc",` a name, in `{"parts":[…]}`
		req.Parts = append(req.Parts, string([]byte{alnum[i/(62*62)%62], alnum[i/62%62], alnum[i%62]}))
	}
	if b, _ := json.Marshal(req); len(b) > 1<<20 || len(b) < 1<<20-6 {
		t.Fatalf("a commit body of %d bytes; want the most of 1 MiB", len(b))
	}
	st.Parts = req.Parts
	for _, p := range req.Parts {
		st.Checksums = append(st.Checksums, api.PartChecksum{Part: p, Checksum: "sha256"})
	}
	b, err := json.Marshal(st)
	if err != nil || len(b) > leaderAnswerLimit {
		t.Fatalf("the answer to %d parts: %d bytes, %v; the bound is %d", len(req.Parts), len(b), err, leaderAnswerLimit)
	}
}

func isStatus(err error, status int) bool {
	e, ok := errors.AsType[*api.Error](err)
	return ok && e.Status == status
}

// Uploads lists a committed step from the catalog (live holders as
// replicas) and an uncommitted one from what the members hold.
func TestUploadsCountCopies(t *testing.T) {
	p0, p1 := []byte("zero"), []byte("one")
	b := newPeer(t, servePart(nil, "", []HeldPart{{Part: "1", Bytes: 3, Sum: sum(p1)}, {Part: "0", Bytes: 4, Sum: sum(p0)}}))
	cat := newCkCatalog(true, ckOf("job", &catalog.CheckpointStep{Step: 1, Parts: []catalog.CheckpointPart{partOf("0", p0, "a", "b", "z")}}))
	s := newDecisionService(t, cat, newCluster([]string{"a", "b"}, map[string]*peer{"b": b}))
	ctx := bounded(t)
	up, err := s.Uploads(ctx, "job", 1)
	if err != nil || !up.Committed || len(up.Parts) != 1 || up.Parts[0].Replicas != 2 || up.Parts[0].Bytes != 4 {
		t.Fatalf("committed: %+v %v", up, err)
	}
	if err := putReplica(t, s, 2, "1", bytes.NewReader(p1), p1); err != nil {
		t.Fatal(err)
	}
	up, err = s.Uploads(ctx, "job", 2)
	if err != nil || up.Committed || len(up.Parts) != 2 {
		t.Fatalf("uploads: %+v %v", up, err)
	}
	if up.Parts[0].Part != "0" || up.Parts[0].Replicas != 1 || up.Parts[1].Part != "1" || up.Parts[1].Replicas != 2 || up.Parts[1].Bytes != 3 {
		t.Fatalf("uploads: %+v", up.Parts)
	}
	if _, err := s.Uploads(ctx, "../x", 1); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a bad name: %v", err)
	}
}

// Delete: a name with only uploads has every member drop its own (not found
// when nobody held any); a committed one is deleted through raft, on the
// leader or relayed to it.
func TestDeleteUploadsAndCommitted(t *testing.T) {
	var dropped int
	b := newPeer(t, func(w http.ResponseWriter, r *http.Request, _ []byte) { json.NewEncoder(w).Encode(dropped) })
	cat := newCkCatalog(true)
	cl := newCluster([]string{"a", "b"}, map[string]*peer{"b": b})
	s := newDecisionService(t, cat, cl)
	ctx := bounded(t)
	if err := s.Delete(ctx, "job", false); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("nothing anywhere: %v", err)
	}
	dropped = 2
	if err := s.Delete(ctx, "job", false); err != nil {
		t.Fatalf("b held two: %v", err)
	}
	if !slices.Contains(b.requests(), "DELETE /v1/internal/checkpoints/job") {
		t.Fatalf("b asked %v", b.requests())
	}
	dropped = 0
	body := []byte("here")
	if err := putReplica(t, s, 1, "0", bytes.NewReader(body), body); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "job", false); err != nil {
		t.Fatalf("this node held one: %v", err)
	}
	if _, parts := s.mem.usage(); parts != 0 {
		t.Fatal("this node's upload stayed")
	}
	cat.set(ckOf("job", &catalog.CheckpointStep{Step: 1}))
	if err := s.Delete(ctx, "job", false); err != nil || !slices.Equal(cat.deleted, []string{"job"}) {
		t.Fatalf("leader delete: %v %v", err, cat.deleted)
	}
	// A follower relays it; the leader's refusal is its answer.
	refuse := true
	leader := newPeer(t, func(w http.ResponseWriter, _ *http.Request, _ []byte) {
		if refuse {
			http.Error(w, "no", http.StatusConflict)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		go cat.set()
	})
	cat.leader = false
	cl.leaderAt = leader.addr()
	if err := s.Delete(ctx, "job", false); !isStatus(err, http.StatusConflict) {
		t.Fatalf("the leader refused: %v", err)
	}
	refuse = false
	if err := s.Delete(ctx, "job", false); err != nil {
		t.Fatal(err)
	}
	if _, ok := cat.Checkpoint("job"); ok {
		t.Fatal("returned before the local catalog showed the delete")
	}
	if got := leader.requests(); !slices.Equal(got, []string{"DELETE /v1/checkpoints/job", "DELETE /v1/checkpoints/job"}) || len(cat.deleted) != 1 {
		t.Fatalf("relayed %v, deleted here %v", got, cat.deleted)
	}
	if err := s.Delete(ctx, "a/b", false); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a bad name: %v", err)
	}
}

// The cleanup frees the parts of deleted checkpoints, of steps the catalog
// dropped, and uploads older than the newest commit; it keeps committed
// steps and newer uploads.
func TestCleanLoopFreesWhatNobodyNeeds(t *testing.T) {
	cat := newCkCatalog(true)
	s := newDecisionService(t, cat, newCluster([]string{"a"}, nil))
	b := []byte("x")
	put := func(name string, step uint64, part string) {
		t.Helper()
		if err := s.Put(bounded(t), PutRequest{Name: name, Step: step, Part: part, Sum: sum(b), Size: 1, Replica: true}, bytes.NewReader(b)); err != nil {
			t.Fatal(err)
		}
	}
	put("job", 1, "0")
	put("job", 2, "0")
	put("job", 3, "0")
	put("job", 4, "0")
	put("gone", 1, "0")
	put("never", 1, "0")
	s.wg.Add(1)
	go s.cleanLoop()
	t.Cleanup(func() { s.cancel(); s.wg.Wait() })
	job := ckOf("job", &catalog.CheckpointStep{Step: 3, Parts: []catalog.CheckpointPart{partOf("0", b, "a")}})
	gone := ckOf("gone", &catalog.CheckpointStep{Step: 1, Parts: []catalog.CheckpointPart{partOf("0", b, "a")}})
	// Each look sends an update: the loop may not be waiting on the first.
	testutil.Await(t, "uploads older than the commit freed", func() bool { cat.set(job, gone); return len(s.mem.keys()) == 4 })
	testutil.Await(t, "the deleted checkpoint freed", func() bool { cat.set(job); return len(s.mem.keys()) == 3 })
	keys := s.mem.keys()
	slices.SortFunc(keys, func(x, y partKey) int { return cmpStr(fmt.Sprint(x), fmt.Sprint(y)) })
	want := []partKey{{"job", 3, "0"}, {"job", 4, "0"}, {"never", 1, "0"}}
	if !slices.Equal(keys, want) {
		t.Fatalf("held %v; want %v", keys, want)
	}
}

// List, Get and a step's info: the newest step, meta, checksums and the
// fewest live copies of any part.
func TestListAndGetShowLiveReplicas(t *testing.T) {
	p0 := []byte("zero")
	st1 := &catalog.CheckpointStep{Step: 1, Parts: []catalog.CheckpointPart{partOf("0", p0, "a", "b")}}
	st2 := &catalog.CheckpointStep{Step: 2, Meta: `{"epoch":2}`, Persisted: true,
		Parts: []catalog.CheckpointPart{partOf("0", p0, "a", "b"), partOf("1", p0, "a", "z")}}
	empty := &catalog.CheckpointStep{Step: 5}
	cat := newCkCatalog(true, ckOf("job", st1, st2), ckOf("none", empty))
	s := newDecisionService(t, cat, newCluster([]string{"a", "b"}, nil))
	list := s.List()
	if len(list) != 2 || *list[0].Latest != 2 || len(list[0].Steps) != 2 {
		t.Fatalf("list: %+v", list)
	}
	if got := list[0].Steps[0]; got.Replicas != 2 || got.Bytes != 4 {
		t.Fatalf("step 1: %+v", got)
	}
	got := list[0].Steps[1]
	if got.Replicas != 1 || !got.Persisted || string(got.Meta) != `{"epoch":2}` || !slices.Equal(got.Parts, []string{"0", "1"}) || got.Bytes != 8 {
		t.Fatalf("step 2: %+v", got)
	}
	if len(got.Checksums) != 2 || got.Checksums[1].Part != "1" || got.Checksums[1].Checksum != AlgoOf(sum(p0)) {
		t.Fatalf("checksums: %+v", got.Checksums)
	}
	if e := list[1].Steps[0]; e.Replicas != 0 || len(e.Parts) != 0 || e.Meta != nil {
		t.Fatalf("a step of no parts: %+v", e)
	}
	if ck, err := s.Get("job"); err != nil || *ck.Latest != 2 {
		t.Fatalf("get: %+v %v", ck, err)
	}
	if _, err := s.Get("nope"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("get of nothing: %v", err)
	}
	if _, err := s.Get("no/pe"); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("get of a bad name: %v", err)
	}
}

// The metrics: each checkpoint's newest step, its age, and (with persist)
// how long the oldest unpersisted step has waited.
func TestCollectMetrics(t *testing.T) {
	cat := newCkCatalog(true, ckOf("job", &catalog.CheckpointStep{Step: 4}, &catalog.CheckpointStep{Step: 6, Persisted: true}), ckOf("empty"))
	s := newDecisionService(t, cat, newCluster([]string{"a"}, nil))
	collect := func() map[string]float64 {
		ch := make(chan prometheus.Metric, 16)
		s.Collect(ch)
		close(ch)
		out := map[string]float64{}
		for m := range ch {
			var pb dto.Metric
			if err := m.Write(&pb); err != nil {
				t.Fatal(err)
			}
			name := m.Desc().String()
			name = name[strings.Index(name, `"`)+1:]
			name = name[:strings.Index(name, `"`)]
			out[name] = pb.GetGauge().GetValue()
		}
		return out
	}
	s.steps.note(s, time.Now().Add(-time.Hour))
	got := collect()
	if got["stallfree_checkpoint_latest_step"] != 6 || got["stallfree_checkpoint_latest_age_seconds"] < 3600 || len(got) != 2 {
		t.Fatalf("without persist: %v", got)
	}
	s.persist = &failingBackend{}
	got = collect()
	if w := got["stallfree_checkpoint_unpersisted_age_seconds"]; w < 3600 {
		t.Fatalf("step 4 waited %v s", w)
	}
	descs := make(chan *prometheus.Desc, 4)
	s.Describe(descs)
	close(descs)
	if len(descs) != 3 {
		t.Fatalf("%d descriptions", len(descs))
	}
	// A step gone from the catalog is forgotten.
	cat.set(ckOf("job", &catalog.CheckpointStep{Step: 6, Persisted: true}))
	s.steps.note(s, time.Now())
	if _, ok := s.steps.at("job", 4); ok {
		t.Fatal("a dropped step is remembered")
	}
	if got := collect()["stallfree_checkpoint_unpersisted_age_seconds"]; got != 0 {
		t.Fatalf("all persisted, waited %v", got)
	}
}

// The persistent store's specs, and a dir store keeping whole objects only.
func TestBackends(t *testing.T) {
	for _, bad := range []string{"", "dir://relative", "file:///x", "s3:/x"} {
		if _, err := openBackend(bad, source.S3Config{}); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	root := filepath.Join(t.TempDir(), "p")
	be, err := openBackend("dir://"+root, source.S3Config{})
	if err != nil || be.String() != "dir://"+root {
		t.Fatalf("%v %v", be, err)
	}
	ctx := context.Background()
	if err := be.Put(ctx, "n/1/0", strings.NewReader("abc"), 4); err == nil {
		t.Fatal("a short body persisted")
	}
	if _, _, err := be.Open(ctx, "n/1/0"); err == nil {
		t.Fatal("a short body left an object")
	}
	if err := be.Put(ctx, "n/1/0", strings.NewReader("abcd"), 4); err != nil {
		t.Fatal(err)
	}
	rc, n, err := be.Open(ctx, "n/1/0")
	if err != nil || n != 4 {
		t.Fatalf("open: %d %v", n, err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "abcd" {
		t.Fatalf("read %q", b)
	}
	entries, _ := os.ReadDir(filepath.Join(root, "n", "1"))
	if len(entries) != 1 {
		t.Fatalf("left %d files", len(entries))
	}
}

// The budget admits a part of exactly the room left and a part of no
// bytes; a freed mapping is kept for the next part of its size, and spares
// are unmapped only as far as the budget needs.
func TestMemoryEdgesAndSpares(t *testing.T) {
	m := newMemory(10)
	m.perPart = 0 // the byte edges alone (TestEveryPartIsChargedItsBookkeeping charges parts)
	defer m.dropAll()
	if b, err := m.reserve(0); err != nil || len(b) != 0 {
		t.Fatalf("a part of no bytes: %v", err)
	}
	if _, err := m.reserve(-1); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("a negative size: %v", err)
	}
	six, err := m.reserve(6)
	if err != nil {
		t.Fatal(err)
	}
	m.free(six)
	again, err := m.reserve(6)
	if err != nil || &again[0] != &six[0] {
		t.Fatalf("a freed mapping of the size was not reused: %v", err)
	}
	m.free(again)
	four, err := m.reserve(4) // 4 in use + 6 spare: exactly the budget, the spare stays
	if err != nil || m.spareBytes != 6 {
		t.Fatalf("reserve 4 next to a spare of 6: %v, spare %d", err, m.spareBytes)
	}
	m.free(four)
	five, err := m.reserve(5) // 5 + 4 + 6 > 10: spares go
	if err != nil || m.spareBytes > 5 {
		t.Fatalf("reserve 5: %v, spare %d", err, m.spareBytes)
	}
	m.free(five)
	if ten, err := m.reserve(10); err != nil || len(ten) != 10 {
		t.Fatalf("exactly the budget: %v", err)
	} else {
		m.free(ten)
	}
	if used, _ := m.usage(); used != 0 {
		t.Fatalf("used %d", used)
	}
	// Two spares of one size go together, and are counted out together.
	m2 := newMemory(10)
	m2.perPart = 0
	defer m2.dropAll()
	x, _ := m2.reserve(3)
	y, _ := m2.reserve(3)
	m2.free(x)
	m2.free(y)
	if _, err := m2.reserve(5); err != nil || m2.spareBytes != 0 || len(m2.spare) != 0 {
		t.Fatalf("after unmapping two spares of 3: %v, %d spare bytes", err, m2.spareBytes)
	}
}

// A part of no bytes is stored; a body whose last read also says EOF is
// whole.
func TestPutEdges(t *testing.T) {
	s := newTestService(t, &stepCatalog{})
	if err := putReplica(t, s, 1, "empty", bytes.NewReader(nil), nil); err != nil {
		t.Fatalf("a part of no bytes: %v", err)
	}
	body := []byte("ends with its EOF")
	if err := putReplica(t, s, 1, "0", iotest.DataErrReader(bytes.NewReader(body)), body); err != nil {
		t.Fatalf("a body whose last read says EOF: %v", err)
	}
	if got := localBytes(t, s, 1, "0"); !bytes.Equal(got, body) {
		t.Fatalf("stored %q", got)
	}
	if got := localBytes(t, s, 1, "empty"); len(got) != 0 {
		t.Fatalf("stored %q", got)
	}
	err := putReplica(t, s, 1, "1", bytes.NewReader(body[:5]), body)
	if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "after 5 of 17 bytes: unexpected EOF") {
		t.Fatalf("a body cut off: %v", err)
	}
}

// Group is the pair or, for an odd last node, the triple.
func TestGroup(t *testing.T) {
	five := []string{"a", "b", "c", "d", "e"}
	for self, want := range map[string][]string{"a": {"a", "b"}, "b": {"a", "b"}, "c": {"c", "d", "e"}, "e": {"c", "d", "e"}} {
		if got := Group(five, self); !slices.Equal(got, want) {
			t.Errorf("Group(%v, %s) = %v; want %v", five, self, got, want)
		}
	}
	if got := Group([]string{"a", "b", "c", "d"}, "d"); !slices.Equal(got, []string{"c", "d"}) {
		t.Errorf("Group of d among four: %v", got)
	}
	if got := Group([]string{"a", "b", "c"}, "c"); !slices.Equal(got, []string{"a", "b", "c"}) {
		t.Errorf("Group of c among three: %v", got)
	}
	if Group([]string{"a"}, "a") != nil || Group(five, "z") != nil {
		t.Error("a group of one, or of a stranger")
	}
}

// After a step is persisted the steps still pending are counted at once:
// two committed, one persisted, one pending.
func TestPendingCountAfterAPersist(t *testing.T) {
	body := []byte("to persist")
	cat := newCkCatalog(true)
	s := newDecisionService(t, cat, newCluster([]string{"a"}, nil))
	s.cfg.Tick = time.Hour
	s.persist = &failingBackend{objs: map[string][]byte{}}
	for _, step := range []uint64{1, 2} {
		if err := putReplica(t, s, step, "0", bytes.NewReader(body), body); err != nil {
			t.Fatal(err)
		}
	}
	s.wg.Add(1)
	go s.leaderLoop()
	t.Cleanup(func() { s.cancel(); s.wg.Wait() })
	testutil.Await(t, "the loop waiting", func() bool { return cat.looks() >= 1 })
	cat.set(ckOf("job", &catalog.CheckpointStep{Step: 1, Version: 1, Parts: []catalog.CheckpointPart{partOf("0", body, "a")}},
		&catalog.CheckpointStep{Step: 2, Version: 2, Parts: []catalog.CheckpointPart{partOf("0", body, "a")}}))
	testutil.Await(t, "the loop waiting again", func() bool { return cat.looks() >= 2 })
	if st := s.Stats(); st.PersistedSteps != 1 || st.PersistPending != 1 {
		t.Fatalf("after one persist of two: %+v", st)
	}
}

// A part of no bytes reads from a peer as no bytes.
func TestOpenAnEmptyPartFromAPeer(t *testing.T) {
	c := newPeer(t, servePart([]byte{}, "", nil))
	cat := newCkCatalog(true, ckOf("job", &catalog.CheckpointStep{Step: 1, Parts: []catalog.CheckpointPart{partOf("e", nil, "c")}}))
	s := newDecisionService(t, cat, newCluster([]string{"a", "c"}, map[string]*peer{"c": c}))
	p, err := s.Open(bounded(t), "job", 1, "e", false)
	if err != nil || p.Size != 0 || p.From != "peer" {
		t.Fatalf("open: %+v %v", p, err)
	}
	if got, err := readAll(t, p); err != nil || len(got) != 0 {
		t.Fatalf("read %q %v", got, err)
	}
}

// A step's replicas are its worst part's, even when that has none live; a
// closed read lets its part's memory go once the part is dropped.
func TestWorstPartAndClosedReads(t *testing.T) {
	p0 := []byte("zero")
	cat := newCkCatalog(true, ckOf("job", &catalog.CheckpointStep{Step: 1,
		Parts: []catalog.CheckpointPart{partOf("0", p0, "z"), partOf("1", p0, "a", "b")}}))
	s := newDecisionService(t, cat, newCluster([]string{"a", "b"}, nil))
	if ck, err := s.Get("job"); err != nil || ck.Steps[0].Replicas != 0 {
		t.Fatalf("replicas of a step with a part nobody live holds: %+v %v", ck, err)
	}
	if err := putReplica(t, s, 2, "0", bytes.NewReader(p0), p0); err != nil {
		t.Fatal(err)
	}
	p, err := s.Open(bounded(t), "job", 2, "0", true)
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
	p.Close() // twice is harmless
	s.DropLocal("job")
	if used, parts := s.mem.usage(); used != 0 || parts != 0 {
		t.Fatalf("after a closed read and the drop: %d bytes in %d parts", used, parts)
	}
}

// A survivor that fails to send its copy on leaves the part as it was.
func TestRepairFromAFailingSurvivor(t *testing.T) {
	body := []byte("part bytes")
	c := newPeer(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		if r.Method == http.MethodPost {
			http.Error(w, "disk full", http.StatusInsufficientStorage)
			return
		}
		json.NewEncoder(w).Encode([]HeldPart{{Part: "0", Bytes: int64(len(body)), Sum: sum(body)}})
	})
	d := newPeer(t, servePart(nil, "", nil))
	cat := newCkCatalog(true, ckOf("job", &catalog.CheckpointStep{Step: 1, Version: 1, Parts: []catalog.CheckpointPart{partOf("0", body, "b", "c")}}))
	s := newDecisionService(t, cat, newCluster([]string{"a", "c", "d"}, map[string]*peer{"c": c, "d": d}))
	rs := newRepairState()
	rs.deadSince["b"] = time.Now().Add(-2 * s.cfg.DeadGrace)
	rs.ticks = 1 // not a verification tick
	s.repair(rs)
	if len(cat.holders) != 0 || s.Stats().Rereplicated != 0 {
		t.Fatalf("a failed copy was recorded: %v", cat.holders)
	}
	if !slices.Contains(c.requests(), "POST "+internalPath("job", 1, "/parts/0/copy?to="+d.addr())) {
		t.Fatalf("c was asked %v", c.requests())
	}
}

// A surviving holder that freezes while asked to copy (SIGSTOP, a paused
// VM) holds the leader's repair loop for the copy's deadline, not 10
// minutes: the deadline follows the part's size.
func TestRepairGivesUpOnAFrozenSource(t *testing.T) {
	body := []byte("part bytes")
	release := make(chan struct{})
	c := newPeer(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		if r.Method == http.MethodPost {
			<-release // frozen, the connection open
			return
		}
		json.NewEncoder(w).Encode([]HeldPart{{Part: "0", Bytes: int64(len(body)), Sum: sum(body)}})
	})
	t.Cleanup(func() { close(release) })
	d := newPeer(t, servePart(nil, "", nil))
	cat := newCkCatalog(true, ckOf("job", &catalog.CheckpointStep{Step: 1, Version: 1, Parts: []catalog.CheckpointPart{partOf("0", body, "b", "c")}}))
	s := newDecisionService(t, cat, newCluster([]string{"a", "c", "d"}, map[string]*peer{"c": c, "d": d}))
	s.cfg.PeerIdle = 50 * time.Millisecond
	rs := newRepairState()
	rs.deadSince["b"] = time.Now().Add(-2 * s.cfg.DeadGrace)
	rs.ticks = 1
	done := make(chan struct{})
	go func() { s.repair(rs); close(done) }()
	select {
	case <-done:
	case <-bounded(t).Done():
		t.Fatal("the repair loop is still held by a frozen source")
	}
	if len(cat.holders) != 0 || s.Stats().Rereplicated != 0 {
		t.Fatalf("a copy that never answered was recorded: %v", cat.holders)
	}
	if got, want := copyDeadline(256<<20, 30*time.Second), 30*time.Second+129*time.Second; got != want {
		t.Fatalf("the deadline of a 256 MiB part: %v, want %v", got, want)
	}
	if got := copyDeadline(3<<30, 30*time.Second); got != maxCopyTime {
		t.Fatalf("the deadline of a 3 GiB part: %v, want at most %v", got, maxCopyTime)
	}
}

// A peer that stops sending a part's body halfway (frozen: SIGSTOP, a
// paused VM) fails the read after PeerIdle without a byte, instead of holding
// it, the leader's persisting and the node's shutdown for as long as it
// stays frozen; a peer that keeps sending, however slowly, is read whole.
func TestAFrozenPeersBodyFailsAfterIdle(t *testing.T) {
	body := bytes.Repeat([]byte("part bytes "), 1000)
	release := make(chan struct{})
	frozen := newPeer(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set(api.HeaderChecksum, sum(body))
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		w.Write(body[:100])
		w.(http.Flusher).Flush()
		<-release // frozen, the connection open
	})
	t.Cleanup(func() { close(release) }) // before the server's Close, which waits for the frozen handler
	slow := newPeer(t, func(w http.ResponseWriter, r *http.Request, _ []byte) {
		w.Header().Set(api.HeaderChecksum, sum(body))
		w.Header().Set("Content-Length", fmt.Sprint(len(body)))
		for off := 0; off < len(body); off += 2500 {
			w.Write(body[off:min(off+2500, len(body))])
			w.(http.Flusher).Flush()
			time.Sleep(60 * time.Millisecond) // longer in all than PeerIdle, never idle that long
		}
	})
	for name, c := range map[string]*peer{"frozen": frozen, "slow": slow} {
		cat := newCkCatalog(true, ckOf("job", &catalog.CheckpointStep{Step: 1, Parts: []catalog.CheckpointPart{partOf("0", body, "c")}}))
		s := newDecisionService(t, cat, newCluster([]string{"a", "c"}, map[string]*peer{"c": c}))
		s.cfg.PeerIdle = 100 * time.Millisecond
		p, err := s.Open(bounded(t), "job", 1, "0", false)
		if err != nil {
			t.Fatalf("%s: open: %v", name, err)
		}
		got, err := readAll(t, p)
		switch {
		case name == "frozen" && err == nil:
			t.Fatalf("a frozen peer's body read %d bytes and no error", len(got))
		case name == "slow" && (err != nil || !bytes.Equal(got, body)):
			t.Fatalf("a slow peer's body: %d bytes, %v", len(got), err)
		}
	}
}
