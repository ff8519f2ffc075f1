package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/internal/testcatalog"
	"stallfree/internal/testutil"
	"stallfree/relay"
)

// Commit and repair decide on a real one-member raft catalog; the other
// members are fake peers serving the internal routes.

// fakePeer is a member's internal checkpoint routes: the parts it holds
// (held), and the copies sent to it (got).
type fakePeer struct {
	srv  *httptest.Server
	mu   sync.Mutex
	held []HeldPart
	got  map[string][]byte // path → body of each PUT
}

func newFakePeer(t *testing.T) *fakePeer {
	p := &fakePeer{got: map[string][]byte{}}
	p.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.mu.Lock()
		defer p.mu.Unlock()
		switch r.Method {
		case http.MethodGet:
			json.NewEncoder(w).Encode(p.held)
		case http.MethodPut:
			b, _ := io.ReadAll(r.Body)
			p.got[r.URL.RequestURI()] = b
			w.WriteHeader(http.StatusCreated)
		default:
			w.WriteHeader(http.StatusMethodNotAllowed)
		}
	}))
	t.Cleanup(p.srv.Close)
	return p
}

func (p *fakePeer) addr() string { return strings.TrimPrefix(p.srv.URL, "http://") }

// liveMembers are this node (a) and the fake peers by name.
type liveMembers struct {
	mu    sync.Mutex
	self  string
	peers map[string]*fakePeer
}

func (m *liveMembers) Members() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []string{m.self}
	for n := range m.peers {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func (m *liveMembers) MemberHTTP(name string) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if p, ok := m.peers[name]; ok {
		return p.addr(), true
	}
	return "", false
}

func (m *liveMembers) LeaderHTTP() string { return "" }

func newLeaderService(t *testing.T, peers map[string]*fakePeer) (*Service, *catalog.Catalog, *liveMembers) {
	t.Helper()
	cat := testcatalog.Leader(t, "a")
	members := &liveMembers{self: "a", peers: peers}
	s := &Service{cfg: Config{Self: "a", Keep: 2, DeadGrace: time.Millisecond}, cat: cat, members: members,
		mem: newMemory(1 << 20), log: testutil.Discard(), ctx: context.Background(), peers: relay.New("a", "")}
	t.Cleanup(s.mem.dropAll)
	return s, cat, members
}

func storeHere(t *testing.T, s *Service, part string, b []byte) {
	t.Helper()
	if err := putReplica(t, s, 1, part, bytes.NewReader(b), b); err != nil {
		t.Fatal(err)
	}
}

// twoCopies counts the version most nodes hold, and needs two of it.
func TestTwoCopies(t *testing.T) {
	c := func(node, sum string) copyOf { return copyOf{node: node, HeldPart: HeldPart{Sum: sum, Bytes: 5}} }
	if p, ok := twoCopies([]copyOf{c("b", "x"), c("a", "x")}); !ok || !slices.Equal(p.Holders, []string{"a", "b"}) || p.Sum != "x" || p.Size != 5 {
		t.Fatalf("two alike: %+v %v", p, ok)
	}
	if _, ok := twoCopies([]copyOf{c("a", "x"), c("b", "y")}); ok {
		t.Fatal("two copies of different bytes count as two copies")
	}
	if p, ok := twoCopies([]copyOf{c("a", "x"), c("b", "y"), c("c", "y")}); !ok || p.Sum != "y" || len(p.Holders) != 2 {
		t.Fatalf("the version two hold: %+v %v", p, ok)
	}
	if _, ok := twoCopies(nil); ok {
		t.Fatal("no copies are two")
	}
}

// A commit counts each part's copies here and at the members: it commits
// when every listed part has two alike, names the parts that do not (and
// commits nothing), and refuses bad requests before asking anyone.
func TestCommitCountsCopies(t *testing.T) {
	b := newFakePeer(t)
	s, cat, _ := newLeaderService(t, map[string]*fakePeer{"b": b})
	p0, p1 := []byte("part zero"), []byte("part one!")
	storeHere(t, s, "0", p0)
	storeHere(t, s, "1", p1)
	b.held = []HeldPart{{Part: "0", Bytes: int64(len(p0)), Sum: sum(p0)}, {Part: "1", Bytes: int64(len(p1)), Sum: sum([]byte("other"))}}
	ctx := context.Background()
	_, err := s.Commit(ctx, "job", 1, api.CommitCheckpoint{Parts: []string{"0", "1", "2"}}, false)
	var missing *MissingError
	if !errors.As(err, &missing) || !slices.Equal(missing.Parts, []string{"1", "2"}) {
		t.Fatalf("commit with part 1 held in two versions and part 2 nowhere: %v", err)
	}
	if _, ok := cat.Checkpoint("job"); ok {
		t.Fatal("a refused commit committed")
	}
	for _, bad := range []api.CommitCheckpoint{{}, {Parts: []string{"0", "0"}}, {Parts: []string{"../x"}}, {Parts: []string{"0"}, Meta: json.RawMessage("{")}} {
		if _, err := s.Commit(ctx, "job", 1, bad, false); !errors.Is(err, ErrBadRequest) {
			t.Errorf("commit %+v: %v; want a bad request", bad, err)
		}
	}
	st, err := s.Commit(ctx, "job", 1, api.CommitCheckpoint{Parts: []string{"0"}, Meta: json.RawMessage(`{"epoch":3}`)}, false)
	if err != nil || st.Step != 1 || !slices.Equal(st.Parts, []string{"0"}) || st.Replicas != 2 {
		t.Fatalf("commit of part 0: %+v %v", st, err)
	}
	ck, _ := cat.Checkpoint("job")
	step, _ := ck.Step(1)
	if p, _ := step.Part("0"); p.Sum != sum(p0) || !slices.Equal(p.Holders, []string{"a", "b"}) {
		t.Fatalf("committed part: %+v", p)
	}
	// Counted, then committed: this node keeps the counted bytes.
	if err := putReplica(t, s, 1, "0", bytes.NewReader(p1), p1); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("rewriting a committed part: %v", err)
	}
}

// Repair: a holder gone for longer than DeadGrace is replaced by the
// surviving holder's partner among the members left, which gets the
// committed bytes; the catalog then names the new holders. A surviving copy
// that is not the committed one is never sent on.
func TestRepairCopiesToTheSurvivorsPartner(t *testing.T) {
	c := newFakePeer(t)
	s, cat, _ := newLeaderService(t, map[string]*fakePeer{"c": c})
	body := []byte("committed bytes")
	storeHere(t, s, "0", body)
	if _, err := cat.CommitCheckpoint("job", 1, []catalog.CheckpointPart{{Name: "0", Size: int64(len(body)), Sum: sum(body), Holders: []string{"a", "b"}}}, "", 2); err != nil {
		t.Fatal(err)
	}
	rs := newRepairState()
	s.repair(rs) // b is first seen missing
	time.Sleep(2 * time.Millisecond)
	s.repair(rs) // and now gone for longer than DeadGrace
	ck, _ := cat.Checkpoint("job")
	st, _ := ck.Step(1)
	if p, _ := st.Part("0"); !slices.Equal(p.Holders, []string{"a", "c"}) {
		t.Fatalf("holders after repair: %v; want a and its partner c", p.Holders)
	}
	c.mu.Lock()
	got := c.got["/v1/internal/checkpoints/job/steps/1/parts/0?repair=1"]
	c.mu.Unlock()
	if !bytes.Equal(got, body) {
		t.Fatalf("c received %q", got)
	}
	if s.Stats().Rereplicated != 1 {
		t.Fatalf("rereplicated %d", s.Stats().Rereplicated)
	}
}
