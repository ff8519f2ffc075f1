package derived

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/internal/testcatalog"
	"stallfree/internal/testutil"
	"stallfree/relay"
	"stallfree/source"
	"stallfree/store"
)

// The prep cache's decisions, on a one-member raft catalog and a real store;
// the host (ownership, members, the leader) is a fake. The proof on real
// nodes is in integration/derived_test.go.

type fakeHost struct {
	cat     *catalog.Catalog
	owner   string            // every item's owner
	addrs   map[string]string // member → HTTP address
	members []string
}

func (h *fakeHost) Owner(*catalog.Dataset, int) (string, bool) { return h.owner, h.owner == "self" }
func (h *fakeHost) HTTPAddr(m string) (string, bool)           { a, ok := h.addrs[m]; return a, ok }
func (h *fakeHost) Members() []string                          { return h.members }
func (h *fakeHost) Derive(_ context.Context, name, parent, stage string) (api.Dataset, bool, error) {
	d, created, err := h.cat.DeriveDataset(name, parent, stage)
	if err != nil {
		return api.Dataset{}, false, err
	}
	return Info(d), created, nil
}

type fixture struct {
	p    *Prep
	cat  *catalog.Catalog
	st   *store.Store
	host *fakeHost
}

func newFixture(t *testing.T, capacity uint64) *fixture {
	t.Helper()
	cat := testcatalog.Leader(t, "self")
	pol, _ := store.NewPolicy("minio")
	st, err := store.New(capacity, pol)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	entries := []source.Entry{{Key: "a", Size: 10}, {Key: "b", Size: 10}, {Key: "c", Size: 10}}
	if _, _, err := cat.RegisterDataset("parent", "dir:///nowhere", entries, 0); err != nil {
		t.Fatal(err)
	}
	h := &fakeHost{cat: cat, owner: "self", addrs: map[string]string{}, members: []string{"self"}}
	return &fixture{p: New(Config{Name: "self", Relay: relay.New("self", ""), Logger: testutil.Discard()}, cat, st, h), cat: cat, st: st, host: h}
}

func (f *fixture) derive(t *testing.T) *catalog.Dataset {
	t.Helper()
	info, created, err := f.p.Derive(context.Background(), "dec", "parent", "decode-v1")
	if err != nil || !created || info.DerivedFrom != "parent" || info.Items != 3 {
		t.Fatalf("derive: %+v %v %v", info, created, err)
	}
	d, _ := f.cat.Dataset("dec")
	return d
}

func TestDeriveChecksTheRequest(t *testing.T) {
	f := newFixture(t, 1<<20)
	for _, c := range []struct{ name, parent, stage, why string }{
		{"x", "", "s", "empty parent"},
		{"parent", "parent", "s", "itself"},
		{"x", "parent", "", "empty stage"},
		{"x", "parent", strings.Repeat("s", maxStage+1), "long stage"},
		{"x", "parent", "red\x1b[31m", "escape code"},
		{"x", "parent", "\x07bell first", "a control character first"},
		{"x", "parent", "bidi\u202eevil", "format character"},
		{"x", "parent", "bad\xff", "invalid UTF-8"},
	} {
		if _, _, err := f.p.Derive(context.Background(), c.name, c.parent, c.stage); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v; want ErrInvalid", c.why, err)
		}
	}
	if _, _, err := f.p.Derive(context.Background(), "x", "parent", strings.Repeat("s", maxStage)); err != nil {
		t.Fatalf("a stage of exactly %d bytes: %v", maxStage, err)
	}
	if _, created, err := f.p.Derive(context.Background(), "x", "parent", strings.Repeat("s", maxStage)); err != nil || created {
		t.Fatalf("the same derivation again: created %v, %v", created, err)
	}
	if _, _, err := f.p.Derive(context.Background(), "y", "x", "again"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("deriving from a derived dataset: %v; want ErrInvalid (400)", err)
	}
	if ds := f.cat.Datasets(); len(ds) != 2 {
		t.Fatalf("refused derivations changed the catalog: %d datasets", len(ds))
	}
}

// Items are written once: the same bytes again are fine, other bytes a
// conflict that keeps the first; writes to a parent, past the end or over
// the size bound are refused before anything is stored.
func TestWriteOnce(t *testing.T) {
	f := newFixture(t, 1<<20)
	d := f.derive(t)
	if created, err := f.p.Write(d, 1, []byte("decoded")); err != nil || !created {
		t.Fatalf("first write: %v %v", created, err)
	}
	if created, err := f.p.Write(d, 1, []byte("decoded")); err != nil || created {
		t.Fatalf("the same bytes again: %v %v", created, err)
	}
	if _, err := f.p.Write(d, 1, []byte("DECODED")); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("other bytes: %v", err)
	}
	ref, ok := f.st.Get(store.MakeKey(d.ID, 1))
	if !ok || string(ref.Data) != "decoded" {
		t.Fatal("the first bytes did not stay")
	}
	ref.Release()
	parent, _ := f.cat.Dataset("parent")
	f.p.cfg.MaxItemBytes = 8
	for _, c := range []struct {
		d     *catalog.Dataset
		i     int
		data  string
		want  error
		label string
	}{
		{parent, 0, "x", ErrNotDerived, "a parent"},
		{d, 3, "x", ErrOutOfRange, "past the end"},
		{d, -1, "x", ErrOutOfRange, "a negative index"},
		{d, 0, "123456789", ErrTooLarge, "over the bound"},
	} {
		if _, err := f.p.Write(c.d, c.i, []byte(c.data)); !errors.Is(err, c.want) {
			t.Errorf("%s: %v; want %v", c.label, err, c.want)
		}
	}
	if _, err := f.p.Write(d, 0, []byte("12345678")); err != nil {
		t.Fatalf("exactly MaxItemBytes: %v", err)
	}
	if u := f.p.Usage(); len(u) != 1 || u[0].Name != "dec" || u[0].Items != 2 || u[0].DerivedFrom != "parent" {
		t.Fatalf("usage: %+v", u)
	}
}

// Of many writers of different bytes to one item, exactly one wins.
func TestConcurrentWritersOneWins(t *testing.T) {
	f := newFixture(t, 1<<20)
	d := f.derive(t)
	var (
		wg        sync.WaitGroup
		mu        sync.Mutex
		created   int
		conflicts int
	)
	for w := range 16 {
		wg.Go(func() {
			c, err := f.p.Write(d, 2, []byte{byte(w)})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case c:
				created++
			case errors.Is(err, catalog.ErrConflict):
				conflicts++
			}
		})
	}
	wg.Wait()
	if created != 1 || conflicts != 15 {
		t.Fatalf("%d created, %d conflicts; want 1 and 15", created, conflicts)
	}
}

// Writes of different items do not wait for each other: with item 2's
// write held up (its lock taken, as a slow writer would hold it), items 0
// and 1 are written, and item 2's writer goes on once let go.
func TestWritesOfDifferentItemsDoNotWaitForEachOther(t *testing.T) {
	f := newFixture(t, 1<<20)
	d := f.derive(t)
	held := f.p.writeLock(store.MakeKey(d.ID, 2))
	held.Lock()
	var release sync.Once
	let := func() { release.Do(held.Unlock) }
	t.Cleanup(let) // a failure below leaves no writer blocked
	slow := make(chan error, 1)
	go func() {
		_, err := f.p.Write(d, 2, []byte("two"))
		slow <- err
	}()
	for _, i := range []int{0, 1} {
		if f.p.writeLock(store.MakeKey(d.ID, uint32(i))) == held {
			t.Fatalf("items %d and 2 share a lock", i)
		}
		done := make(chan error, 1)
		go func() {
			_, err := f.p.Write(d, i, []byte{byte('a' + i)})
			done <- err
		}()
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("write %d: %v", i, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("the write of item %d waited for item 2's", i)
		}
		if ref, ok := f.st.Get(store.MakeKey(d.ID, uint32(i))); !ok || string(ref.Data) != string(rune('a'+i)) {
			t.Fatalf("item %d not held as written", i)
		} else {
			ref.Release()
		}
	}
	let()
	if err := <-slow; err != nil {
		t.Fatalf("write 2: %v", err)
	}
	if ref, ok := f.st.Get(store.MakeKey(d.ID, 2)); !ok || string(ref.Data) != "two" {
		t.Fatal("item 2 not held as written")
	} else {
		ref.Release()
	}
}

// A write the owner's memory cannot hold is ErrFull (507), nothing kept.
func TestWriteWithoutRoom(t *testing.T) {
	f := newFixture(t, 1<<20)
	d := f.derive(t)
	if _, err := f.p.Write(d, 0, make([]byte, 2<<20)); !errors.Is(err, ErrFull) {
		t.Fatalf("an item larger than memory: %v", err)
	}
	if u := f.p.Usage(); len(u) != 0 {
		t.Fatalf("usage after a refused write: %+v", u)
	}
}

// Route sends a write to its owner: here, or the owner's address; unknown
// when the owner has none.
func TestRoute(t *testing.T) {
	f := newFixture(t, 1<<20)
	d := f.derive(t)
	if _, self, ok := f.p.Route(d, 0); !self || !ok {
		t.Fatalf("an item this node owns: self %v ok %v", self, ok)
	}
	f.host.owner, f.host.addrs["n2"] = "n2", "10.0.0.2:7070"
	if addr, self, ok := f.p.Route(d, 0); self || !ok || addr != "10.0.0.2:7070" {
		t.Fatalf("another owner: %q self %v ok %v", addr, self, ok)
	}
	f.host.owner = "n3"
	if _, _, ok := f.p.Route(d, 0); ok {
		t.Fatal("an owner without an address routed")
	}
}

// Count adds what every member holds of each derived dataset; a member that
// does not answer is left out; datasets read from storage are untouched.
func TestCountSumsMembers(t *testing.T) {
	f := newFixture(t, 1<<20)
	d := f.derive(t)
	if _, err := f.p.Write(d, 0, []byte("here")); err != nil {
		t.Fatal(err)
	}
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewEncoder(w).Encode(api.Stats{Datasets: []api.DatasetUsage{
			{Name: "dec", ID: d.ID, DerivedFrom: "parent", Items: 2, Bytes: 100},
			{Name: "parent", ID: 99, Items: 5, Bytes: 500},
		}})
	}))
	defer peer.Close()
	f.host.members = []string{"self", "n2", "gone", "noaddr"}
	f.host.addrs["n2"] = strings.TrimPrefix(peer.URL, "http://")
	f.host.addrs["gone"] = testutil.FreeAddr(t)
	parent, _ := f.cat.Dataset("parent")
	infos := []api.Dataset{{Name: "parent", ID: parent.ID}, Info(d)}
	f.p.Count(context.Background(), infos)
	if infos[0].Written != nil {
		t.Fatalf("a parent got a written count: %v", *infos[0].Written)
	}
	if w := infos[1].Written; w == nil || *w != 3 || infos[1].Bytes != 104 {
		t.Fatalf("derived: written %v, bytes %d; want 3 and 104", w, infos[1].Bytes)
	}
}

// Sync marks derived datasets recomputable and drops what the store holds
// of derived datasets that are gone.
func TestSyncDropsGoneDatasets(t *testing.T) {
	f := newFixture(t, 1<<20)
	d := f.derive(t)
	if _, err := f.p.Write(d, 0, []byte("x")); err != nil {
		t.Fatal(err)
	}
	f.p.Sync()
	if got := f.st.RecomputableDatasets(); len(got) != 1 || got[0] != d.ID {
		t.Fatalf("recomputable: %v", got)
	}
	if err := f.cat.DeleteDataset("dec"); err != nil {
		t.Fatal(err)
	}
	f.p.Sync()
	if _, ok := f.st.Get(store.MakeKey(d.ID, 0)); ok {
		t.Fatal("an item of a deleted derived dataset stayed")
	}
}

// --max-item-bytes is bounded by what the transport moves in one push.
func TestMaxItemBytesBounds(t *testing.T) {
	for in, want := range map[int64]int64{0: DefaultMaxItemBytes, -1: DefaultMaxItemBytes, DefaultMaxItemBytes + 1: DefaultMaxItemBytes,
		DefaultMaxItemBytes: DefaultMaxItemBytes, 1 << 20: 1 << 20} {
		if got := New(Config{MaxItemBytes: in}, nil, nil, nil).MaxItemBytes(); got != want {
			t.Errorf("MaxItemBytes %d: %d, want %d", in, got, want)
		}
	}
}

// Count asks the members only when a derived dataset is listed.
func TestCountAsksNobodyWithoutDerivedDatasets(t *testing.T) {
	f := newFixture(t, 1<<20)
	var asked atomic.Int32
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		json.NewEncoder(w).Encode(api.Stats{})
	}))
	defer peer.Close()
	f.host.members = []string{"self", "n2"}
	f.host.addrs["n2"] = strings.TrimPrefix(peer.URL, "http://")
	parent, _ := f.cat.Dataset("parent")
	f.p.Count(context.Background(), []api.Dataset{{Name: "parent", ID: parent.ID}})
	if n := asked.Load(); n != 0 {
		t.Fatalf("members asked %d times for a list without derived datasets", n)
	}
	f.p.Count(context.Background(), []api.Dataset{Info(f.derive(t))})
	if n := asked.Load(); n != 1 {
		t.Fatalf("members asked %d times for a derived dataset; want 1", n)
	}
}
