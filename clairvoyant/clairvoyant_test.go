package clairvoyant

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/cespare/xxhash/v2"
	"go.uber.org/goleak"

	"stallfree/catalog"
	"stallfree/internal/testutil"
	"stallfree/locality"
	"stallfree/source"
	"stallfree/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const itemSize = 64

// fakeHost is one node running one job of world size 1 over a dataset of
// n items, filling items from memory.
type fakeHost struct {
	epoch  uint64              // the job's latest pinned epoch
	pinned map[uint64][]string // epochs pinned to other members than "m"
	gone   bool                // the job was deleted
	job    *catalog.Job
	data   *catalog.Dataset
	st     *store.Store
	fills  atomic.Int64
}

func newHost(t *testing.T, n, batch int) *fakeHost {
	t.Helper()
	entries := make([]source.Entry, n)
	for i := range entries {
		entries[i] = source.Entry{Key: fmt.Sprintf("k%04d", i), Size: itemSize}
	}
	d := &catalog.Dataset{ID: 1, Name: "ds", Manifest: catalog.NewManifest(entries), Version: 1}
	j := &catalog.Job{Name: "j", Dataset: "ds", Seed: 3, WorldSize: 1, BatchSize: batch, Ranks: []string{"m"}, Version: 1}
	return &fakeHost{job: j, data: d}
}

func (h *fakeHost) Jobs() []*catalog.Job {
	if h.gone {
		return nil
	}
	return []*catalog.Job{h.job}
}
func (h *fakeHost) LatestEpoch(string) (uint64, bool) { return h.epoch, true }
func (h *fakeHost) EpochMembers(_ string, e uint64) ([]string, bool) {
	if m, ok := h.pinned[e]; ok {
		return m, true
	}
	return []string{"m"}, true
}
func (h *fakeHost) Plan(_ string, e uint64) (*locality.EpochPlan, error) {
	return locality.PlanEpoch(h.job, h.data, e, []string{"m"})
}
func (h *fakeHost) PredictPlan(_ string, e uint64) (*locality.EpochPlan, []string, error) {
	ep, err := h.Plan("j", e)
	return ep, []string{"m"}, err
}
func (h *fakeHost) Owns(*catalog.Dataset, int) bool { return true }
func (h *fakeHost) Fill(_ context.Context, d *catalog.Dataset, i int) error {
	h.fills.Add(1)
	b := itemBytes(i)
	err := h.st.Put(store.MakeKey(d.ID, uint32(i)), b, xxhash.Sum64(b))
	if errors.Is(err, store.ErrNotAdmitted) {
		return nil
	}
	return err
}

func itemBytes(i int) []byte { return fmt.Appendf(nil, "%0*d", itemSize, i) }

// withStore gives h a store with room for capItems items under a new
// policy, closed when the test ends (after any cleanup registered later).
func withStore(t *testing.T, h *fakeHost, capItems int) *Clairvoyant {
	t.Helper()
	c := New()
	st, err := store.New(uint64(capItems*(itemSize+store.EntryOverhead)), c.Policy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	h.st = st
	return c
}

// start runs the policy over a store with room for capItems items.
func start(t *testing.T, h *fakeHost, capItems int) (*Clairvoyant, *locality.EpochPlan) {
	t.Helper()
	c := withStore(t, h, capItems)
	ctx, cancel := context.WithCancel(context.Background())
	c.Start(ctx, h, h.st)
	t.Cleanup(func() { cancel(); c.Wait() })
	ep, err := h.Plan("j", 0)
	if err != nil {
		t.Fatal(err)
	}
	return c, ep
}

func resident(h *fakeHost, items []int32) int {
	n := 0
	for _, i := range items {
		if h.st.Contains(store.MakeKey(h.data.ID, uint32(i))) {
			n++
		}
	}
	return n
}

// The policy reads ahead exactly the window of minibatches the loader needs
// next, and moves the window as the loader's requests arrive.
func TestReadsAheadTheWindowAndFollowsTheLoader(t *testing.T) {
	const n, batch = 200, 10
	h := newHost(t, n, batch)
	c, ep := start(t, h, n)
	var window []int32
	for b := range prefetchWindow {
		window = append(window, ep.Batch(0, b)...)
	}
	testutil.Await(t, "the first window read ahead", func() bool { return resident(h, window) == len(window) })
	if got := h.st.Stats().Items; got != len(window) {
		t.Fatalf("%d items resident, want exactly the window's %d", got, len(window))
	}
	// The loader asks for batch 1: the window moves to batches 1..prefetchWindow.
	for _, i := range ep.Batch(0, 1) {
		c.Observe(h.data.ID, int(i), "j")
	}
	next := ep.Batch(0, prefetchWindow)
	testutil.Await(t, "the next batch read ahead", func() bool { return resident(h, next) == len(next) })
	if got, want := h.st.Stats().Items, len(window)+len(next); got != want {
		t.Fatalf("%d items resident, want %d: read ahead beyond the window", got, want)
	}
}

// When the store is full, the item used farthest in the future makes room,
// and an item needed later than everything resident is not admitted.
func TestEvictsFarthestNextUse(t *testing.T) {
	const n, batch = 100, 10
	h := newHost(t, n, batch)
	// Room for one batch, so read-ahead fills it with batch 0 and stops.
	_, ep := start(t, h, batch)
	b0 := ep.Batch(0, 0)
	testutil.Await(t, "batch 0 read ahead", func() bool { return resident(h, b0) == batch })
	late := ep.Batch(0, 9)[0]
	b := itemBytes(int(late))
	if err := h.st.Put(store.MakeKey(h.data.ID, uint32(late)), b, xxhash.Sum64(b)); !errors.Is(err, store.ErrNotAdmitted) {
		t.Fatalf("an item of batch 9 into a store full of batch 0: err %v, want ErrNotAdmitted", err)
	}
	if resident(h, b0) != batch {
		t.Fatal("a batch-0 item was evicted for one needed later")
	}
	// Put the late item in by force of an empty slot, then ask for room for
	// an item of batch 1: the late one must be the victim.
	h.st.Delete(store.MakeKey(h.data.ID, uint32(b0[0])))
	if err := h.st.Put(store.MakeKey(h.data.ID, uint32(late)), b, xxhash.Sum64(b)); err != nil {
		t.Fatal(err)
	}
	soon := ep.Batch(0, 1)[0]
	sb := itemBytes(int(soon))
	if err := h.st.Put(store.MakeKey(h.data.ID, uint32(soon)), sb, xxhash.Sum64(sb)); err != nil {
		t.Fatalf("an item of batch 1: %v", err)
	}
	if h.st.Contains(store.MakeKey(h.data.ID, uint32(late))) {
		t.Fatal("the batch-9 item stayed while a batch-1 item came in")
	}
	if resident(h, b0[1:]) != batch-1 {
		t.Fatal("a batch-0 item was evicted instead of the batch-9 one")
	}
}
