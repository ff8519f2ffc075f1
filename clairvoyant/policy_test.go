package clairvoyant

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
	dto "github.com/prometheus/client_model/go"

	"stallfree/locality"
	"stallfree/store"
)

// held is a policy over a store with room for capItems items, following h's
// job as of its latest epoch, with no read-ahead running: the test alone
// puts and evicts.
func held(t *testing.T, h *fakeHost, capItems int) (*Clairvoyant, *locality.EpochPlan) {
	t.Helper()
	c := withStore(t, h, capItems)
	c.host, c.store = h, h.st
	c.Refresh()
	ep, err := h.Plan("j", h.epoch)
	if err != nil {
		t.Fatal(err)
	}
	return c, ep
}

func (h *fakeHost) put(i int32) error {
	b := itemBytes(int(i))
	return h.st.Put(store.MakeKey(h.data.ID, uint32(i)), b, xxhash.Sum64(b))
}

func (h *fakeHost) holds(i int32) bool { return h.st.Contains(store.MakeKey(h.data.ID, uint32(i))) }

// An item needed at the same step as everything resident does not displace
// it: eviction is for items needed strictly later.
func TestEqualNeedIsNotEvicted(t *testing.T) {
	h := newHost(t, 100, 10)
	_, ep := held(t, h, 1)
	b3 := ep.Batch(0, 3)
	if err := h.put(b3[0]); err != nil {
		t.Fatal(err)
	}
	if err := h.put(b3[1]); !errors.Is(err, store.ErrNotAdmitted) {
		t.Fatalf("a second item of batch 3 into a store full of batch 3: %v, want ErrNotAdmitted", err)
	}
	if !h.holds(b3[0]) {
		t.Fatal("an item was evicted for one needed at the same step")
	}
}

// Room reserved for read-ahead holds nothing to evict: asking for more room
// fails instead of looking for a victim in an empty heap.
func TestNoRoomFromReservationsAlone(t *testing.T) {
	h := newHost(t, 100, 10)
	c, ep := held(t, h, 1)
	b := ep.Batch(0, 1)
	if !c.store.MakeRoom(store.MakeKey(h.data.ID, uint32(b[0])), itemSize) {
		t.Fatal("no room in an empty store")
	}
	if c.store.MakeRoom(store.MakeKey(h.data.ID, uint32(b[1])), itemSize) {
		t.Fatal("room made twice in a store with room for one item and nothing resident")
	}
}

// A slot reused after a removal is judged by its new item's need, not by an
// entry the removed item left in the heap.
func TestReusedSlotIsJudgedByItsNewItem(t *testing.T) {
	h := newHost(t, 100, 10)
	_, ep := held(t, h, 1)
	late, soon, middle := ep.Batch(0, 9)[0], ep.Batch(0, 0)[0], ep.Batch(0, 5)[0]
	if err := h.put(late); err != nil {
		t.Fatal(err)
	}
	h.st.Delete(store.MakeKey(h.data.ID, uint32(late)))
	if err := h.put(soon); err != nil {
		t.Fatal(err)
	}
	if err := h.put(middle); !errors.Is(err, store.ErrNotAdmitted) || !h.holds(soon) {
		t.Fatalf("batch 5 against a resident batch 0 in a reused slot: %v, batch 0 held %v; want ErrNotAdmitted and kept", err, h.holds(soon))
	}
}

// Once the loader has used an item, its next use is an epoch away: it is
// the one to make room, ahead of an item still to be used this epoch.
func TestUsedItemMakesRoomFirst(t *testing.T) {
	h := newHost(t, 100, 10)
	c, ep := held(t, h, 2)
	used, later, incoming := ep.Batch(0, 0)[0], ep.Batch(0, 5)[0], ep.Batch(0, 2)[0]
	for _, i := range []int32{used, later} {
		if err := h.put(i); err != nil {
			t.Fatal(err)
		}
	}
	c.Observe(h.data.ID, int(used), "j")
	if err := h.put(incoming); err != nil {
		t.Fatal(err)
	}
	if h.holds(used) || !h.holds(later) {
		t.Fatalf("after batch 0's item was used: it is held %v, batch 5's %v; want it evicted, batch 5 kept", h.holds(used), h.holds(later))
	}
}

// Refresh keeps a job's cursor while its epoch and version stand, moves it
// to a new epoch with the uses already seen, and starts afresh when the job
// changes.
func TestRefreshFollowsEpochsAndVersions(t *testing.T) {
	h := newHost(t, 100, 10)
	h.epoch = 2
	c, ep := held(t, h, 100)
	cur := c.sched.byJob["j"]
	if cur == nil || cur.cur.Epoch != 2 || cur.next == nil || cur.next.Epoch != 3 || cur.pos.Load() != 2*cur.steps {
		t.Fatalf("the cursor of a job at epoch 2: %+v", cur)
	}
	for i := range cur.lastUse {
		if cur.lastUse[i].Load() != -1 {
			t.Fatalf("item %d: a use before any request", i)
		}
	}
	c.Refresh()
	if c.sched.byJob["j"] != cur {
		t.Fatal("a refresh with nothing changed rebuilt the cursor")
	}

	used := ep.Batch(0, 4)[0]
	c.Observe(h.data.ID, int(used), "j")
	wantUse := cur.lastUse[used].Load()
	if wantUse != 2*cur.steps+4 {
		t.Fatalf("used at epoch 2 step 4: last use %d", wantUse)
	}
	// Epoch 3 pinned while the cursor is still in epoch 2: it jumps to 3's start.
	h.epoch = 3
	c.Refresh()
	if moved := c.sched.byJob["j"]; moved.pos.Load() != 3*moved.steps {
		t.Fatalf("epoch 3 pinned: position %d, want %d", moved.pos.Load(), 3*moved.steps)
	}
	cur = c.sched.byJob["j"]
	ahead := 4*cur.steps + 2 // a rank already reading epoch 4
	cur.pos.Store(ahead)
	h.epoch = 4
	c.Refresh()
	next := c.sched.byJob["j"]
	if next == cur || next.cur.Epoch != 4 || next.next.Epoch != 5 {
		t.Fatal("the cursor did not move to epoch 4")
	}
	if next.lastUse[used].Load() != wantUse || next.pos.Load() != ahead {
		t.Fatalf("a new epoch of the same job: last use %d, position %d; want %d, %d kept", next.lastUse[used].Load(), next.pos.Load(), wantUse, ahead)
	}

	changed := *h.job
	changed.Version++
	h.job = &changed
	c.Refresh()
	fresh := c.sched.byJob["j"]
	if fresh.lastUse[used].Load() != -1 || fresh.pos.Load() != 4*fresh.steps {
		t.Fatalf("a changed job: last use %d, position %d; want -1, %d", fresh.lastUse[used].Load(), fresh.pos.Load(), 4*fresh.steps)
	}
}

// Read-ahead across an epoch boundary: from the last step of epoch 1, the
// window holds that step's batch and the first batches of epoch 2.
func TestReadAheadCrossesTheEpochBoundary(t *testing.T) {
	h := newHost(t, 100, 10)
	h.epoch = 1
	c, ep := held(t, h, 100)
	cur := c.sched.byJob["j"]
	last := 2*cur.steps - 1
	cur.pos.Store(last)
	var inflight sync.Map
	c.prefetchJob(context.Background(), cur, make(chan struct{}, prefetchers), &inflight)
	c.wg.Wait()
	for _, i := range ep.Batch(0, int(cur.steps-1)) {
		if !h.holds(i) {
			t.Fatalf("item %d of epoch 1's last batch not read ahead", i)
		}
	}
	want := 0
	for b := range prefetchWindow - 1 {
		for _, i := range cur.next.Batch(0, b) {
			// Items epoch 1 used within the lag are still this epoch's.
			if cur.nextUse(int(i)) == 2*cur.steps+int64(b) {
				want++
				if !h.holds(i) {
					t.Fatalf("item %d of epoch 2's batch %d not read ahead", i, b)
				}
			}
		}
	}
	if want == 0 {
		t.Fatal("no item of epoch 2's first batches to read ahead: the test proves nothing")
	}
	if got := int(h.fills.Load()); got != len(ep.Batch(0, int(cur.steps-1)))+want {
		t.Fatalf("%d items read ahead, want %d", got, len(ep.Batch(0, int(cur.steps-1)))+want)
	}
	var m dto.Metric
	if err := c.sched.prefetched.WithLabelValues("j").Write(&m); err != nil {
		t.Fatal(err)
	}
	if got := m.GetCounter().GetValue(); int(got) != int(h.fills.Load()) {
		t.Fatalf("stallfree_prefetched_items_total %v, want the %d items read ahead", got, h.fills.Load())
	}
}

// With epochs shorter than the window, read-ahead from the last step of
// epoch 0 takes that batch and epoch 1's, and stops at epoch 1's end (its
// last batch is short: asking past it would slice beyond the order).
func TestReadAheadStopsAtTheNextEpochsEnd(t *testing.T) {
	h := newHost(t, 15, 10) // 2 global minibatches an epoch, the second of 5
	c, ep := held(t, h, 100)
	cur := c.sched.byJob["j"]
	cur.pos.Store(1)
	var inflight sync.Map
	c.prefetchJob(context.Background(), cur, make(chan struct{}, prefetchers), &inflight)
	c.wg.Wait()
	want := len(ep.Batch(0, 1))
	for _, i := range ep.Batch(0, 1) {
		if !h.holds(i) {
			t.Fatalf("item %d of epoch 0's last batch not read ahead", i)
		}
	}
	for b := range 2 {
		for _, i := range cur.next.Batch(0, b) {
			if cur.nextUse(int(i)) == cur.steps+int64(b) {
				want++
			}
		}
	}
	if got := int(h.fills.Load()); got != want {
		t.Fatalf("%d items read ahead, want %d", got, want)
	}
}

// The cursor is rebuilt when the next epoch is pinned to other members than
// it was predicted with, and dropped with its job.
func TestRefreshFollowsPinsAndDeletions(t *testing.T) {
	h := newHost(t, 100, 10)
	h.epoch = 2
	c, _ := held(t, h, 100)
	cur := c.sched.byJob["j"]
	h.pinned = map[uint64][]string{3: {"m", "x"}}
	c.Refresh()
	if c.sched.byJob["j"] == cur {
		t.Fatal("epoch 3 pinned to other members than predicted, and the cursor stayed")
	}
	h.gone = true
	c.Refresh()
	if len(c.sched.byJob) != 0 || len(c.sched.byDataset[h.data.ID]) != 0 {
		t.Fatalf("a deleted job kept its cursor: %d jobs, %d on its dataset", len(c.sched.byJob), len(c.sched.byDataset[h.data.ID]))
	}
}
