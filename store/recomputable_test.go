package store

import (
	"errors"
	"testing"
)

// Recomputable items (a prep cache's) are evicted before any other, whatever
// the policy, never evict one themselves, and stay out of the policy's sight.
func TestRecomputableEvictedFirst(t *testing.T) {
	const size = 1000
	charge := uint64(alignUp(size) + EntryOverhead)
	s := mustNew(t, 10*charge, NewLRU())
	s.MarkRecomputable(2)
	for i := range 4 {
		if err := put(t, s, MakeKey(2, uint32(i)), item(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		if err := put(t, s, MakeKey(1, uint32(i)), item(100+i, size)); err != nil {
			t.Fatal(err)
		}
	}
	// Full. A derived write may not evict.
	if err := put(t, s, MakeKey(2, 9), item(9, size)); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("a recomputable item into a full store: %v", err)
	}
	// Four more parent items evict the four derived ones, not the LRU's
	// least recent parent item.
	for i := 6; i < 10; i++ {
		if err := put(t, s, MakeKey(1, uint32(i)), item(100+i, size)); err != nil {
			t.Fatal(err)
		}
	}
	u := s.Usage()
	if u[1].Items != 10 || u[2].Items != 0 {
		t.Fatalf("usage %+v: want 10 parent, 0 recomputable", u)
	}
	for i := range 10 {
		if !s.Contains(MakeKey(1, uint32(i))) {
			t.Fatalf("parent item %d evicted while recomputable ones were held", i)
		}
	}
	// Now the policy decides again.
	if err := put(t, s, MakeKey(1, 10), item(110, size)); err != nil || s.Contains(MakeKey(1, 0)) {
		t.Fatalf("LRU after the recomputable tier is empty: %v, item 0 held %v", err, s.Contains(MakeKey(1, 0)))
	}
	if n := s.DeleteDataset(2); n != 0 || len(s.RecomputableDatasets()) != 0 {
		t.Fatalf("delete: %d, still marked %v", n, s.RecomputableDatasets())
	}
}
