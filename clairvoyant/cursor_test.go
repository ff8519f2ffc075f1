package clairvoyant

import (
	"sync/atomic"
	"testing"

	"stallfree/locality"
	"stallfree/store"
)

// cursorFor is a job cursor over two items with 10 global minibatches an
// epoch: item 0 is used at step 3 of epoch 2 and step 5 of epoch 3; item 1
// only at step 7 of epoch 2 (dropped from epoch 3's order).
func cursorFor(pos int64, next bool) *cursor {
	c := &cursor{cur: &locality.EpochPlan{Epoch: 2, Step: []int32{3, 7}}, steps: 10, lastUse: make([]atomic.Int64, 2)}
	if next {
		c.next = &locality.EpochPlan{Epoch: 3, Step: []int32{5, -1}}
	}
	for i := range c.lastUse {
		c.lastUse[i].Store(-1)
	}
	c.pos.Store(pos)
	return c
}

func TestCursorTimesAreAbsoluteSteps(t *testing.T) {
	c := cursorFor(0, true)
	if c1, c2 := c.times(0); c1 != 23 || c2 != 35 {
		t.Fatalf("item 0: %d, %d; want 23, 35", c1, c2)
	}
	if c1, c2 := c.times(1); c1 != 27 || c2 != never {
		t.Fatalf("item 1 (dropped next epoch): %d, %d; want 27, never", c1, c2)
	}
	c.cur.Step[1], c.next.Step[1] = 0, 0 // step 0 is a use, not "dropped"
	if c1, c2 := c.times(1); c1 != 20 || c2 != 30 {
		t.Fatalf("uses at step 0: %d, %d; want 20, 30", c1, c2)
	}
	if _, c2 := cursorFor(0, false).times(0); c2 != never {
		t.Fatalf("no next plan: %d, want never", c2)
	}
}

func TestCursorNextUse(t *testing.T) {
	for _, tc := range []struct {
		name      string
		pos, last int64
		next      bool
		item      int
		want      int64
	}{
		{"this epoch's use ahead", 20, -1, true, 0, 23},
		{"this epoch's use just behind, within the lag", 23 + lagSteps, -1, true, 0, 23},
		{"this epoch's use too far behind", 23 + lagSteps + 1, -1, true, 0, 35},
		{"this epoch's use done: the next epoch's", 20, 23, true, 0, 35},
		{"both uses done", 40, 35, true, 0, never},
		{"done, and no use next epoch", 20, 27, true, 1, never},
		{"done, and no next plan", 20, 23, false, 0, never},
	} {
		c := cursorFor(tc.pos, tc.next)
		c.lastUse[tc.item].Store(tc.last)
		if got := c.nextUse(tc.item); got != tc.want {
			t.Errorf("%s: next use %d, want %d", tc.name, got, tc.want)
		}
	}
}

func TestCursorDueWithinTheWindow(t *testing.T) {
	edge := int64(23 - prefetchWindow - lagSteps) // item 0 at 23 is due from this position on
	if c := cursorFor(edge, true); !c.due(0) {
		t.Fatalf("at %d, item 0 (used at 23) is not due", edge)
	}
	if c := cursorFor(edge-1, true); c.due(0) {
		t.Fatalf("at %d, item 0 (used at 23) is already due", edge-1)
	}
	c := cursorFor(20, true)
	c.lastUse[1].Store(27)
	if c.due(1) {
		t.Fatal("an item with no use left is due")
	}
}

func TestCursorObserveTakesTheNearerUse(t *testing.T) {
	for _, tc := range []struct {
		name            string
		pos             int64
		wantUse, wantAt int64
	}{
		{"nearer this epoch's use: the position stays", 28, 23, 28},
		{"nearer the next epoch's use: the position moves on", 30, 35, 35},
		{"a tie is this epoch's", 29, 23, 29},
		{"ahead of the position: it moves to the use", 10, 23, 23},
	} {
		c := cursorFor(tc.pos, true)
		c.observe(0)
		if got := c.lastUse[0].Load(); got != tc.wantUse {
			t.Errorf("%s: last use %d, want %d", tc.name, got, tc.wantUse)
		}
		if got := c.pos.Load(); got != tc.wantAt {
			t.Errorf("%s: position %d, want %d", tc.name, got, tc.wantAt)
		}
	}
	c := cursorFor(20, false)
	c.cur.Step[1] = -1 // used in neither epoch
	c.observe(1)
	if c.lastUse[1].Load() != -1 || c.pos.Load() != 20 {
		t.Fatalf("an item with no use moved the cursor: last %d, position %d", c.lastUse[1].Load(), c.pos.Load())
	}
	c = cursorFor(30, true)
	c.cur.Step[0] = -1 // only the next epoch's use
	c.observe(0)
	if c.lastUse[0].Load() != 35 || c.pos.Load() != 35 {
		t.Fatalf("only a next-epoch use: last %d, position %d; want 35, 35", c.lastUse[0].Load(), c.pos.Load())
	}
}

// scheduleOf holds cursors of jobs a and b on dataset 1: a at position 20, b
// at 30 (so item 0's use at 23 is behind b and its next use is 35).
func scheduleOf() (*schedule, *cursor, *cursor) {
	s := newSchedule()
	a, b := cursorFor(20, true), cursorFor(30, true)
	a.job, b.job, a.dataset, b.dataset = "a", "b", 1, 1
	s.byJob["a"], s.byJob["b"] = a, b
	s.byDataset[1] = []*cursor{a, b}
	return s, a, b
}

func TestScheduleClockIsTheMeanPosition(t *testing.T) {
	if got := newSchedule().clock(); got != 0 {
		t.Fatalf("no jobs: clock %d, want 0", got)
	}
	s, _, _ := scheduleOf()
	if got := s.clock(); got != 25 {
		t.Fatalf("clock %d, want the mean of 20 and 30", got)
	}
}

func TestSchedulePriorityIsTheNearestUseOnTheClock(t *testing.T) {
	s, _, _ := scheduleOf()
	// Item 0: 3 steps ahead of a (23), 5 ahead of b (35): the clock (25) plus 3.
	if got := s.priority(store.MakeKey(1, 0)); got != 28 {
		t.Fatalf("item 0: priority %d, want 28", got)
	}
	// Item 1: 7 ahead of a (27); b's use at 27 is behind it by more than the lag and it has none next epoch.
	if got := s.priority(store.MakeKey(1, 1)); got != 32 {
		t.Fatalf("item 1: priority %d, want 32", got)
	}
	for _, k := range []store.Key{store.MakeKey(1, 2), store.MakeKey(2, 0)} {
		if got := s.priority(k); got != never {
			t.Fatalf("key %v outside every job: priority %d, want never", k, got)
		}
	}
}

func TestScheduleObserveMovesOnlyTheJobsConcerned(t *testing.T) {
	s, a, b := scheduleOf()
	s.observe(1, 0, "b") // b's batch route: b's cursor only
	if a.lastUse[0].Load() != -1 || b.lastUse[0].Load() != 35 {
		t.Fatalf("a job's request: last uses a %d, b %d; want -1, 35", a.lastUse[0].Load(), b.lastUse[0].Load())
	}
	s, a, b = scheduleOf()
	a.pos.Store(22)     // item 1 (at 27) is due for a now, and for b never
	s.observe(1, 1, "") // no job named: every job for which item 1 is due
	if a.lastUse[1].Load() != 27 || b.lastUse[1].Load() != -1 || a.pos.Load() != 27 {
		t.Fatalf("an anonymous request: last uses a %d, b %d; want 27 (due for a), -1 (not for b)", a.lastUse[1].Load(), b.lastUse[1].Load())
	}
	s.observe(1, 2, "") // just past every job's items: nothing moves, nothing panics
	s.observe(1, 5, "")
	s.observe(7, 0, "")
}

// A priority goes stale as jobs move at their own speeds: an item ranked
// when it was far is not evicted once it is needed sooner than the incoming
// item, and one that stays far still is.
func TestVictimJudgesCurrentPriorities(t *testing.T) {
	s, a, _ := scheduleOf()
	p := newPolicy(s)
	item0, item1 := store.MakeKey(1, 0), store.MakeKey(1, 1)
	p.track(1, item1) // 7 steps ahead of a: 32 on the clock
	a.observe(0)      // a reads item 0 at 23; the clock moves to 26
	// Item 1 is now 4 ahead of a (30); incoming item 0 is next used by b
	// at 35, 5 ahead (31).
	if got, want := s.priority(item1), s.priority(item0); got != 30 || want != 31 {
		t.Fatalf("priorities: item 1 %d, item 0 %d; want 30, 31", got, want)
	}
	if slot, ok := p.Victim(item0); ok {
		t.Fatalf("slot %d evicted for an item needed later than it", slot)
	}
	if p.h[0].prio != 30 {
		t.Fatalf("item 1 left ranked at %d, want its current 30", p.h[0].prio)
	}
	// b moves to 34: item 0 is next used 1 ahead of b (29 on the clock of
	// 28), item 1 still 4 ahead of a (32): item 1 makes room.
	s.byJob["b"].pos.Store(34)
	if slot, ok := p.Victim(item0); !ok || slot != 1 {
		t.Fatalf("victim %d, %v: want item 1's slot for an item needed sooner", slot, ok)
	}
}

// Each resident slot has exactly one current heap entry, however often it is
// touched, removed and reused: entries left by earlier items or touches are
// recognised as stale and popped, so the heap does not grow with accesses.
func TestOneCurrentEntryPerSlot(t *testing.T) {
	s, _, _ := scheduleOf()
	p := newPolicy(s)
	current := func() map[uint32]int {
		n := map[uint32]int{}
		for _, e := range p.h {
			if p.live[e.slot] && p.gen[e.slot] == e.gen {
				n[e.slot]++
			}
		}
		return n
	}
	item0, item1 := store.MakeKey(1, 0), store.MakeKey(1, 1)
	p.Added(0, item0)
	p.Accessed(0, item0)
	p.Removed(0, item0)
	p.Added(0, item1) // slot 0 reused by another item
	p.Added(1, item0)
	p.Removed(1, item0)
	p.Added(1, item0)
	if got := current(); len(got) != 2 || got[0] != 1 || got[1] != 1 {
		t.Fatalf("current entries per slot %v, want one for each of slots 0 and 1", got)
	}
	p.Removed(0, item1)
	p.Removed(1, item0)
	if slot, ok := p.Victim(item0); ok || p.h.Len() != 0 {
		t.Fatalf("nothing resident: victim %d, %v, %d entries left", slot, ok, p.h.Len())
	}
}
