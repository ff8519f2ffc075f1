package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/cluster"
	"stallfree/internal/testutil"
	"stallfree/partition"
	"stallfree/store"
)

// twoMembers is node t1's view of a cluster whose other member, t2, the test
// plays: the ring is real, t2 answers from what it holds, and every request
// to it is counted.
type twoMembers struct {
	self string
	ring *partition.Ring

	mu      sync.Mutex
	held    map[itemRef][]byte // what t2 answers with
	pushed  map[int][]byte     // what was pushed to t2
	pushes  []int              // bytes per push
	counts  []int              // items per push
	down    bool               // t2 answers nothing
	full    bool               // t2 keeps nothing pushed
	pushErr error
	owner   func(i int) string // when set, who owns what, whatever the ring says
	// onHandoff, when set, runs as t1 asks t2 for an item it took over.
	onHandoff func(d *catalog.Dataset, i int)
	others    []api.Member // when set, the other members Describe shows
	http      string       // when set, t2's HTTP address

	single, batches, handoffs atomic.Int64
}

func newTwoMembers(t *testing.T) *twoMembers {
	t.Helper()
	r, err := partition.New([]string{"t1", "t2"})
	if err != nil {
		t.Fatal(err)
	}
	return &twoMembers{self: "t1", ring: r, held: map[itemRef][]byte{}, pushed: map[int][]byte{}}
}

func (p *twoMembers) Owner(d *catalog.Dataset, i int) (string, bool) {
	o := p.Ring().Owner(d.Name, d.Manifest.OwnerKey(i))
	if p.owner != nil {
		o = p.owner(i)
	}
	return o, o == p.self
}

// itemRef names an item of any dataset.
type itemRef struct {
	dataset string
	index   int
}

func (p *twoMembers) answer(owner string, d *catalog.Dataset, i int) (cluster.Fill, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	b, ok := p.held[itemRef{d.Name, i}]
	if p.down || owner != "t2" || !ok {
		return cluster.Fill{}, false
	}
	return cluster.Fill{Data: bytes.Clone(b), Sum: xxhash.Sum64(b)}, true
}

func (p *twoMembers) FromOwner(_ context.Context, owner string, d *catalog.Dataset, i int) (cluster.Fill, bool) {
	p.single.Add(1)
	return p.answer(owner, d, i)
}

func (p *twoMembers) Handoff(_ context.Context, d *catalog.Dataset, i int) (cluster.Fill, bool) {
	p.handoffs.Add(1)
	if p.onHandoff != nil {
		p.onHandoff(d, i)
	}
	return cluster.Fill{}, false
}

func (p *twoMembers) PushToOwner(_ context.Context, owner string, d *catalog.Dataset, indices []int, data [][]byte) ([]bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if owner != "t2" {
		return nil, fmt.Errorf("pushed to %s", owner)
	}
	if p.pushErr != nil {
		return nil, p.pushErr
	}
	kept, size := make([]bool, len(indices)), 0
	for j, i := range indices {
		size += len(data[j])
		if !p.full {
			p.pushed[i], kept[j] = bytes.Clone(data[j]), true
			p.held[itemRef{d.Name, i}] = p.pushed[i]
		}
	}
	p.pushes, p.counts = append(p.pushes, size), append(p.counts, len(indices))
	return kept, nil
}

func (p *twoMembers) FromOwners(_ context.Context, d *catalog.Dataset, indices []int) ([]cluster.Fill, []bool) {
	p.batches.Add(1)
	got, found := make([]cluster.Fill, len(indices)), make([]bool, len(indices))
	for x, i := range indices {
		owner, _ := p.Owner(d, i)
		got[x], found[x] = p.answer(owner, d, i)
	}
	return got, found
}

func (p *twoMembers) Joined() bool      { return true }
func (p *twoMembers) Members() []string { return p.Ring().Members() }
func (p *twoMembers) HTTPAddr(m string) (string, bool) {
	if p.http != "" && m == "t2" {
		return p.http, true
	}
	return m + ".example:7070", m == "t2"
}

// setRing replaces the ring with one of members, while the node runs.
func (p *twoMembers) setRing(t *testing.T, members ...string) {
	t.Helper()
	r, err := partition.New(members)
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.ring = r
	p.mu.Unlock()
}

// Ring is the ring now; a test may replace it while the node runs.
func (p *twoMembers) Ring() *partition.Ring {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ring
}

func (p *twoMembers) Describe(self api.Member) []api.Member {
	if p.others != nil {
		return append([]api.Member{self}, p.others...)
	}
	return []api.Member{self, {Name: "t2", State: "alive"}}
}
func (p *twoMembers) Stats() cluster.Stats        { return cluster.Stats{} }
func (p *twoMembers) Leave(context.Context) error { return nil }
func (p *twoMembers) Close()                      {}

// split names the items of d each member owns.
func (p *twoMembers) split(d *catalog.Dataset) (mine, theirs []int) {
	for i := range d.Manifest.Len() {
		if _, self := p.Owner(d, i); self {
			mine = append(mine, i)
		} else {
			theirs = append(theirs, i)
		}
	}
	return mine, theirs
}

// withTwoMembers is a node t1 in a two-member cluster whose t2 holds its
// share of the dataset.
func withTwoMembers(t *testing.T, items, size int) (*Node, *catalog.Dataset, map[string][]byte, *twoMembers) {
	t.Helper()
	n, d, files := startNode(t, items, size, 64<<20, false)
	p := newTwoMembers(t)
	mine, theirs := p.split(d)
	if len(mine) == 0 || len(theirs) == 0 {
		t.Fatalf("ring gives t1 %d and t2 %d items: pick another item count", len(mine), len(theirs))
	}
	for _, i := range theirs {
		p.held[itemRef{d.Name, i}] = files[d.Manifest.Key(i)]
	}
	n.peers = p
	return n, d, files, p
}

// Get serves an item t2 owns from t2 and keeps no copy; an item t1 owns is
// read from storage once, kept, and served from memory after.
func TestGetRoutesByOwner(t *testing.T) {
	n, d, files, p := withTwoMembers(t, 40, 256)
	mine, theirs := p.split(d)
	ctx := context.Background()
	for round, want := range []Cache{Miss, Hit} {
		for i := range d.Manifest.Len() {
			it, err := n.Get(ctx, d, i)
			if err != nil {
				t.Fatal(err)
			}
			wantCache := want
			if _, self := p.Owner(d, i); !self {
				wantCache = Peer
			}
			if it.Cache != wantCache || !bytes.Equal(it.Data, files[d.Manifest.Key(i)]) || it.Sum != xxhash.Sum64(it.Data) || it.Key != d.Manifest.Key(i) {
				t.Fatalf("round %d item %d: %s, %d bytes; want %s and the file's bytes", round, i, it.Cache, len(it.Data), wantCache)
			}
			it.Release()
		}
	}
	st := n.Stats()
	if st.SourceReads != uint64(len(mine)) || st.Misses != uint64(len(mine)) || st.HitsLocal != uint64(len(mine)) ||
		st.HitsPeer != uint64(2*len(theirs)) || st.ItemsCached != len(mine) || p.single.Load() != int64(2*len(theirs)) {
		t.Fatalf("stats %+v, %d peer requests; want %d items read and kept, %d peer hits", st, p.single.Load(), len(mine), 2*len(theirs))
	}
	for _, i := range theirs {
		if n.Split().Holds(d, i) {
			t.Fatalf("item %d of t2 kept on t1", i)
		}
	}
	if p.handoffs.Load() != int64(len(mine)) {
		t.Fatalf("%d handoffs asked for %d first reads of owned items", p.handoffs.Load(), len(mine))
	}
	if _, err := n.Get(ctx, d, d.Manifest.Len()); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("index past the end: %v", err)
	}
	if _, err := n.Get(ctx, d, -1); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("negative index: %v", err)
	}
}

// When the owner does not answer, the item is read from storage and not
// kept: it is not this node's to hold.
func TestOwnerGoneReadsStorageWithoutKeeping(t *testing.T) {
	n, d, files, p := withTwoMembers(t, 40, 256)
	p.down = true
	_, theirs := p.split(d)
	for _, i := range theirs {
		it, err := n.Get(context.Background(), d, i)
		if err != nil || it.Cache != Miss || !bytes.Equal(it.Data, files[d.Manifest.Key(i)]) {
			t.Fatalf("item %d: %v, %s", i, err, it.Cache)
		}
		it.Release()
		if n.Split().Holds(d, i) {
			t.Fatalf("item %d of t2 kept after a storage read", i)
		}
	}
	if st := n.Stats(); st.SourceReads != uint64(len(theirs)) || st.ItemsCached != 0 {
		t.Fatalf("stats %+v: want %d storage reads and nothing kept", st, len(theirs))
	}
}

// A peer's request is filled here and never sent on to another member: an
// item this node owns is kept, one it does not is read and not kept.
func TestFillForPeerNeverAsksAnotherOwner(t *testing.T) {
	n, d, files, p := withTwoMembers(t, 40, 256)
	mine, theirs := p.split(d)
	for _, i := range []int{mine[0], theirs[0]} {
		f, err := forPeers{n}.FillForPeer(context.Background(), d, i)
		if err != nil || !bytes.Equal(f.Data, files[d.Manifest.Key(i)]) || f.Sum != xxhash.Sum64(f.Data) {
			t.Fatalf("item %d: %v", i, err)
		}
	}
	if p.single.Load()+p.batches.Load() != 0 {
		t.Fatalf("%d requests to t2 while filling for a peer", p.single.Load()+p.batches.Load())
	}
	if !n.Split().Holds(d, mine[0]) || n.Split().Holds(d, theirs[0]) {
		t.Fatalf("kept: own item %v, t2's item %v; want only its own", n.Split().Holds(d, mine[0]), n.Split().Holds(d, theirs[0]))
	}
	if p.handoffs.Load() != 1 {
		t.Fatalf("%d handoffs: want one, for the item it owns", p.handoffs.Load())
	}
}

// GetMany asks t2 once for all it owns, reads t1's own items, and answers in
// the order asked; the in-flight budget is held until every item is
// released.
func TestGetManyAsksEachOwnerOnce(t *testing.T) {
	n, d, files, p := withTwoMembers(t, 40, 256)
	mine, theirs := p.split(d)
	idx := make([]int, d.Manifest.Len())
	for x := range idx {
		idx[x] = len(idx) - 1 - x
	}
	for round := range 2 {
		items, err := n.GetManyFor(context.Background(), d, idx, "")
		if err != nil {
			t.Fatal(err)
		}
		if n.inflight.used != uint64(len(idx)*256) {
			t.Fatalf("round %d: %d bytes in flight while %d are held", round, n.inflight.used, len(idx)*256)
		}
		for x, it := range items {
			i := idx[x]
			want := Peer
			if _, self := p.Owner(d, i); self {
				want = map[int]Cache{0: Miss, 1: Hit}[round]
			}
			if it.Cache != want || it.Key != d.Manifest.Key(i) || !bytes.Equal(it.Data, files[it.Key]) {
				t.Fatalf("round %d position %d (item %d): %s %q; want %s and the file's bytes", round, x, i, it.Cache, it.Key, want)
			}
			it.Release()
		}
		if n.inflight.used != 0 {
			t.Fatalf("round %d: %d bytes still in flight after every release", round, n.inflight.used)
		}
	}
	if p.batches.Load() != 2 || p.single.Load() != 0 {
		t.Fatalf("%d batch and %d single requests to t2: want one batch per GetMany", p.batches.Load(), p.single.Load())
	}
	st := n.Stats()
	if st.SourceReads != uint64(len(mine)) || st.HitsPeer != uint64(2*len(theirs)) || st.HitsLocal != uint64(len(mine)) || st.Misses != uint64(len(mine)) {
		t.Fatalf("stats %+v", st)
	}

	// t2 gone: its items are read here, one by one after the batch failed.
	p.down = true
	items, err := n.GetManyFor(context.Background(), d, theirs, "")
	if err != nil {
		t.Fatal(err)
	}
	for x, it := range items {
		if it.Cache != Miss || !bytes.Equal(it.Data, files[d.Manifest.Key(theirs[x])]) {
			t.Fatalf("item %d with t2 gone: %s", theirs[x], it.Cache)
		}
		it.Release()
	}
	if p.single.Load() != int64(len(theirs)) {
		t.Fatalf("%d single requests after the batch failed, want %d", p.single.Load(), len(theirs))
	}
}

// A batch is refused whole, before anything is read, when it is too long,
// names an item that does not exist, or needs more than the in-flight
// budget; while other batches hold the budget it is busy, and once they are
// released it is served.
func TestGetManyBounds(t *testing.T) {
	n, d, _ := startNode(t, 8, 1000, 1<<20, false)
	ctx := context.Background()
	if _, err := n.GetManyFor(ctx, d, make([]int, MaxBatch+1), ""); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("%d items: %v", MaxBatch+1, err)
	}
	most, err := n.GetManyFor(ctx, d, make([]int, MaxBatch), "")
	if err != nil {
		t.Fatalf("%d items (the limit): %v", MaxBatch, err)
	}
	for _, it := range most {
		it.Release()
	}
	for _, bad := range [][]int{{0, 8}, {-1}, {3, 2, 100}} {
		if _, err := n.GetManyFor(ctx, d, bad, ""); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("%v: %v", bad, err)
		}
	}
	n.inflight.limit = 3000
	if _, err := n.GetManyFor(ctx, d, []int{0, 1, 2, 3}, ""); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("4000 bytes under a 3000-byte budget: %v", err)
	}
	held, err := n.GetManyFor(ctx, d, []int{0, 1, 2}, "")
	if err != nil {
		t.Fatalf("exactly the budget: %v", err)
	}
	if _, err := n.GetManyFor(ctx, d, []int{4}, ""); !errors.Is(err, ErrBusy) {
		t.Fatalf("past a held budget: %v", err)
	}
	held[0].Release()
	again, err := n.GetManyFor(ctx, d, []int{4}, "")
	if err != nil {
		t.Fatalf("after a release: %v", err)
	}
	for _, it := range append(held[1:], again...) {
		it.Release()
	}
	if n.Stats().SourceReads != 4 { // items 0 (the MaxBatch batch), 1, 2 and 4
		t.Fatalf("%d storage reads: a refused batch read something", n.Stats().SourceReads)
	}
}

// The batch bounds are inclusive: MaxBatch one-member samples, and a batch
// of exactly MaxBatchBytes, pass them and meet the in-flight budget (held
// full here, so they are busy and nothing is read); a byte more is too large
// whatever the budget.
func TestBatchBoundsAreInclusive(t *testing.T) {
	const size = MaxBatchBytes / MaxBatch
	n, d, _ := startNode(t, 2, size, 1<<20, false)
	ctx := context.Background()
	bigger := addDataset(t, n, "bigger", 1, size+1)
	samples, _ := tarDataset(t, n, 1, 2, 10, "jpg")
	n.inflight.limit, n.inflight.used = 1<<40, 1<<40
	if _, err := n.GetManyFor(ctx, d, make([]int, MaxBatch), ""); !errors.Is(err, ErrBusy) {
		t.Fatalf("a batch of exactly %d bytes: %v, want busy", MaxBatchBytes, err)
	}
	if _, err := n.GetManyFor(ctx, bigger, make([]int, MaxBatch), ""); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a batch of %d bytes: %v, want too large", MaxBatch*(size+1), err)
	}
	if _, _, err := n.GetSamplesFor(ctx, samples, make([]int, MaxBatch), ""); !errors.Is(err, ErrBusy) {
		t.Fatalf("%d one-member samples: %v, want busy", MaxBatch, err)
	}
	if n.Stats().SourceReads != 0 {
		t.Fatalf("%d storage reads for batches that were refused", n.Stats().SourceReads)
	}
}

// holdingAll is a lone node t1 that has read, and holds, every item.
func holdingAll(t *testing.T, items, size int) (*Node, *catalog.Dataset, map[string][]byte) {
	t.Helper()
	n, d, files := startNode(t, items, size, 64<<20, false)
	for i := range items {
		it, err := n.Get(context.Background(), d, i)
		if err != nil {
			t.Fatal(err)
		}
		it.Release()
	}
	return n, d, files
}

// The loop sweeps once the ring has held for a tick, on every tick until a
// sweep completes, once more sweepAgain ticks later, and then not until the
// ring changes, even back to a version swept before.
func TestSweepSchedule(t *testing.T) {
	var s sweepSchedule
	ticks := func(v uint64, n int) (sweeps []int) {
		t.Helper()
		for tick := 1; tick <= n; tick++ {
			if s.due(v) {
				sweeps = append(sweeps, tick)
				s.swept(true)
			}
		}
		return sweeps
	}
	if s.due(0) { // the first ring's version, here the zero value
		t.Fatal("swept on the tick a new ring was seen")
	}
	if !s.due(0) {
		t.Fatal("no sweep once the ring held for a tick")
	}
	s.swept(false)
	if !s.due(0) {
		t.Fatal("an incomplete sweep was not tried again on the next tick")
	}
	s.swept(true)
	if got := ticks(0, 3*sweepAgain); !slices.Equal(got, []int{sweepAgain}) {
		t.Fatalf("after a complete sweep, sweeps on ticks %v; want only %d", got, sweepAgain)
	}
	if got := ticks(7, 3); !slices.Equal(got, []int{2}) {
		t.Fatalf("a new ring swept on ticks %v; want 2", got)
	}
	if got := ticks(0, 2); !slices.Equal(got, []int{2}) {
		t.Fatalf("a ring back at a version swept before swept on ticks %v; want 2", got)
	}
}

// sweepContext bounds a test's direct rehome calls: a sweep that stops
// making progress (a batch that consumes no index) would otherwise spin
// until the test binary's own timeout, where with this it ends incomplete
// and the test says which sweep. Real sweeps run under the node's context.
func sweepContext(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// rehome moves each copy t1 holds of an item t2 owns to t2, in pushes
// bounded like a warm-up's, and drops it only once t2 keeps it.
func TestRehomeMovesCopiesToTheirOwner(t *testing.T) {
	const items, size = 160, 64 << 10
	n, d, files := holdingAll(t, items, size)
	ctx := sweepContext(t)
	p := newTwoMembers(t)
	n.peers = p
	mine, theirs := p.split(d)

	p.pushErr = errors.New("t2 is busy")
	if moved, complete := n.rehome(ctx); complete || moved != 0 {
		t.Fatalf("after a failed push rehome reported %d moved, complete %v", moved, complete)
	}
	p.pushErr, p.full = nil, true
	if moved, complete := n.rehome(ctx); !complete || moved != 0 {
		t.Fatalf("when t2 kept nothing rehome reported %d moved, complete %v", moved, complete)
	}
	if st := n.Stats(); st.ItemsCached != items {
		t.Fatalf("%d items left after pushes t2 did not keep: want all %d", st.ItemsCached, items)
	}
	p.full, p.pushes = false, nil
	if moved, complete := n.rehome(ctx); !complete || moved != len(theirs) {
		t.Fatalf("rehome reported %d moved, complete %v; t2 owns %d", moved, complete, len(theirs))
	}
	for _, i := range theirs {
		if n.Split().Holds(d, i) || !bytes.Equal(p.pushed[i], files[d.Manifest.Key(i)]) {
			t.Fatalf("item %d: still on t1 %v, pushed bytes equal %v", i, n.Split().Holds(d, i), bytes.Equal(p.pushed[i], files[d.Manifest.Key(i)]))
		}
	}
	for _, i := range mine {
		if !n.Split().Holds(d, i) || p.pushed[i] != nil {
			t.Fatalf("t1's own item %d moved", i)
		}
	}
	if len(p.pushed) != len(theirs) {
		t.Fatalf("%d items pushed, t2 owns %d", len(p.pushed), len(theirs))
	}
	total := 0
	for _, b := range p.pushes {
		if b > pushBytes {
			t.Fatalf("a push of %d bytes, over %d", b, pushBytes)
		}
		total += b
	}
	if want := (len(theirs)*size + pushBytes - 1) / pushBytes; len(p.pushes) != want || total != len(theirs)*size {
		t.Fatalf("%d pushes of %d bytes in all; want %d of %d", len(p.pushes), total, want, len(theirs)*size)
	}
	if len(theirs)*size > pushBytes && slices.Max(p.pushes) != pushBytes {
		t.Fatalf("pushes of %v bytes: the first should fill exactly %d", p.pushes, pushBytes)
	}
	p.pushes = nil
	if moved, complete := n.rehome(ctx); !complete || moved != 0 || len(p.pushes) != 0 {
		t.Fatalf("a second sweep pushed %d times and reported %d moved with nothing left to move", len(p.pushes), moved)
	}
}

// The owner table names, for every item, the member Owner names, with the
// members' HTTP addresses; it is rebuilt when the ring changes.
func TestOwnersTableMatchesOwner(t *testing.T) {
	n, d, _, p := withTwoMembers(t, 300, 8)
	n.cfg.HTTPAdvert = "t1.example:7070"
	check := func() {
		t.Helper()
		o := n.Owners(d)
		if o.Ring != ringID(p.ring.Version()) || n.RingVersion() != p.ring.Version() || len(o.Owners) != d.Manifest.Len() {
			t.Fatalf("table of ring %s with %d owners; want ring %x, %d", o.Ring, len(o.Owners), p.ring.Version(), d.Manifest.Len())
		}
		for x, m := range o.Members {
			if want := m.Name + ".example:7070"; m.Name != p.ring.Members()[x] || m.HTTP != want {
				t.Fatalf("member %d: %+v", x, m)
			}
		}
		for i, x := range o.Owners {
			if owner, _ := p.Owner(d, i); o.Members[x].Name != owner {
				t.Fatalf("item %d: table says %s, Owner says %s", i, o.Members[x].Name, owner)
			}
		}
	}
	check()
	r, err := partition.New([]string{"t1", "t2", "t3"})
	if err != nil {
		t.Fatal(err)
	}
	p.mu.Lock()
	p.ring = r
	p.mu.Unlock()
	check()
}

// A lone node's table names itself for every item.
func TestOwnersTableAlone(t *testing.T) {
	n, d, _ := startNode(t, 10, 8, 1<<20, false)
	o := n.Owners(d)
	if len(o.Members) != 1 || o.Members[0].Name != "t1" || len(o.Owners) != 10 || slices.ContainsFunc(o.Owners, func(b byte) bool { return b != 0 }) {
		t.Fatalf("table %+v", o)
	}
}

// A warm-up in a cluster reads only the items this node owns.
func TestWarmupReadsOnlyItsShare(t *testing.T) {
	n, d, _, p := withTwoMembers(t, 60, 512)
	mine, _ := p.split(d)
	if pr := n.WarmupProgress(d); pr.Total != int64(len(mine)) || pr.Running || pr.Done != 0 {
		t.Fatalf("progress before: %+v, want a total of %d", pr, len(mine))
	}
	n.StartWarmup(d)
	awaitWarmup(t, n, d)
	pr, st := n.WarmupProgress(d), n.Stats()
	if pr.Done != int64(len(mine)) || pr.Total != int64(len(mine)) || pr.Bytes != int64(len(mine)*512) || pr.Full || pr.Error != "" {
		t.Fatalf("progress %+v: want %d items of 512 bytes", pr, len(mine))
	}
	if st.SourceReads != uint64(len(mine)) || st.ItemsCached != len(mine) || p.single.Load() != 0 {
		t.Fatalf("stats %+v", st)
	}
	for _, i := range mine {
		if !n.Split().Holds(d, i) {
			t.Fatalf("own item %d not warmed", i)
		}
	}
	// Warming again reads nothing: everything is held.
	n.StartWarmup(d)
	awaitWarmup(t, n, d)
	if pr := n.WarmupProgress(d); n.Stats().SourceReads != uint64(len(mine)) || pr.Done != pr.Total || pr.Bytes != int64(len(mine)*512) {
		t.Fatalf("a second warm-up: %+v, %d storage reads", pr, n.Stats().SourceReads)
	}
}

// An owner table names members in one byte each up to 255 members and in
// two (little-endian) from 256 on, as clients decode it.
func TestOwnersTableWidth(t *testing.T) {
	testutil.Long(t)
	n, d, _, p := withTwoMembers(t, 300, 8)
	for _, count := range []int{255, 256} {
		names := make([]string, count)
		for x := range names {
			names[x] = fmt.Sprintf("m%03d", x)
		}
		names[0] = "t1"
		p.setRing(t, names...)
		o := n.Owners(d)
		width := 1
		if count > 255 {
			width = 2
		}
		if len(o.Members) != count || len(o.Owners) != width*d.Manifest.Len() {
			t.Fatalf("%d members: %d named, %d bytes for %d items", count, len(o.Members), len(o.Owners), d.Manifest.Len())
		}
		for i := range d.Manifest.Len() {
			x := int(o.Owners[i])
			if width == 2 {
				x = int(o.Owners[2*i]) | int(o.Owners[2*i+1])<<8
			}
			if owner, _ := p.Owner(d, i); o.Members[x].Name != owner {
				t.Fatalf("%d members, item %d: table says %s, Owner says %s", count, i, o.Members[x].Name, owner)
			}
		}
	}
}

// rewarm warms again what a finished warm-up left missing, and leaves alone
// datasets never warmed or whose warm-up stopped full.
func TestRewarmRefillsWhatIsMissing(t *testing.T) {
	n, d, _ := startNode(t, 20, 64, 1<<20, false)
	n.rewarm()
	if _, ok := n.warmups[d.Name]; ok {
		t.Fatal("rewarm warmed a dataset never warmed")
	}
	n.StartWarmup(d)
	awaitWarmup(t, n, d)
	for _, i := range []int{3, 7} {
		if !n.store.Delete(store.MakeKey(d.ID, uint32(i))) {
			t.Fatalf("item %d was not warmed", i)
		}
	}
	n.rewarm()
	awaitWarmup(t, n, d)
	if !n.Split().Holds(d, 3) || !n.Split().Holds(d, 7) || n.Stats().SourceReads != 22 {
		t.Fatalf("after rewarm: item 3 %v, item 7 %v, %d storage reads (want 20 + 2)", n.Split().Holds(d, 3), n.Split().Holds(d, 7), n.Stats().SourceReads)
	}
	n.warmups[d.Name].full.Store(true)
	n.store.Delete(store.MakeKey(d.ID, 5))
	n.rewarm()
	awaitWarmup(t, n, d)
	if n.Split().Holds(d, 5) {
		t.Fatal("rewarm restarted a warm-up that had stopped full")
	}
}

// An item larger than a push's byte bound still moves, alone in its push.
func TestRehomeMovesAnItemLargerThanAPush(t *testing.T) {
	const items, size = 6, pushBytes + 1
	n, d, files := holdingAll(t, items, size)
	ctx := sweepContext(t)
	p := newTwoMembers(t)
	n.peers = p
	_, theirs := p.split(d)
	if len(theirs) == 0 {
		t.Fatal("t2 owns none of the items: pick another count")
	}
	if moved, complete := n.rehome(ctx); !complete || moved != len(theirs) {
		t.Fatalf("rehome reported %d moved, complete %v; t2 owns %d", moved, complete, len(theirs))
	}
	if len(p.pushes) != len(theirs) || len(p.pushed) != len(theirs) {
		t.Fatalf("%d pushes of %d items for %d items over the bound: want one each", len(p.pushes), len(p.pushed), len(theirs))
	}
	for _, i := range theirs {
		if !bytes.Equal(p.pushed[i], files[d.Manifest.Key(i)]) || n.Split().Holds(d, i) {
			t.Fatalf("item %d not moved", i)
		}
	}
}

// t2's rehoming pushes an item t1 now owns and drops its copy once t1 holds
// it. If the push lands while t1's read of the item asks t2 for it (a
// handoff), t2 has nothing left to give, yet the item is on t1: it is served
// from there, both to t1's readers and to a peer's, and a derived item is
// not answered "not written" (issue 48's integration test saw that 404).
func TestAnItemPushedDuringItsHandoffIsServed(t *testing.T) {
	n, _, _ := startNode(t, 40, 256, 64<<20, false)
	ctx := context.Background()
	if _, _, err := n.Control().Leader().DeriveDataset(ctx, "dec", "ds", "decode"); err != nil {
		t.Fatal(err)
	}
	dec, err := n.Control().Dataset(ctx, "dec")
	if err != nil {
		t.Fatal(err)
	}
	p := newTwoMembers(t)
	bytesOf := func(i int) []byte { return fmt.Appendf(nil, "derived item %d", i) }
	p.onHandoff = func(d *catalog.Dataset, i int) { // the push lands meanwhile
		b := bytesOf(i)
		if err := n.store.Put(store.MakeKey(d.ID, uint32(i)), b, xxhash.Sum64(b)); err != nil {
			t.Error(err)
		}
	}
	n.peers = p
	mine, _ := p.split(dec)
	if len(mine) < 2 {
		t.Fatalf("t1 owns %d items of dec: pick another item count", len(mine))
	}
	local, forPeer := mine[:len(mine)/2], mine[len(mine)/2:]
	for _, i := range local {
		it, err := n.Get(ctx, dec, i)
		if err != nil || !bytes.Equal(it.Data, bytesOf(i)) || it.Cache != Peer {
			t.Fatalf("item %d read on t1: %v, %q from %s; want the pushed bytes", i, err, it.Data, it.Cache)
		}
		it.Release()
	}
	for _, i := range forPeer {
		f, err := forPeers{n}.FillForPeer(ctx, dec, i)
		if err != nil || !bytes.Equal(f.Data, bytesOf(i)) || f.Sum != xxhash.Sum64(f.Data) {
			t.Fatalf("item %d asked for by a peer: %v, %q; want the pushed bytes", i, err, f.Data)
		}
	}
	if got := p.handoffs.Load(); got != int64(len(mine)) {
		t.Fatalf("%d handoffs for %d items: the test did not take the path it means to", got, len(mine))
	}
	if st := n.Stats(); st.SourceReads != 0 {
		t.Fatalf("%d storage reads for a derived dataset", st.SourceReads)
	}
}
