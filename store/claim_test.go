package store

import (
	"errors"
	"testing"
)

func TestClaimMakesRoomEvenUnderMinIO(t *testing.T) {
	const size = 1000
	charge := alignUp(size) + EntryOverhead
	s := mustNew(t, 4*charge, MinIO{})
	for i := range 4 {
		if err := put(t, s, MakeKey(1, uint32(i)), item(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	// Full: MinIO admits nothing more, but a claim makes room by evicting.
	if !s.Claim(2 * charge) {
		t.Fatal("claim refused in a full MinIO store")
	}
	if st := s.Stats(); st.Items != 2 {
		t.Fatalf("%d items after claiming two items' room, want 2", st.Items)
	}
	if err := put(t, s, MakeKey(1, 9), item(9, size)); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("claimed room taken by an item: %v", err)
	}
	if s.Claim(3*charge) || s.Stats().Items != 2 {
		t.Fatalf("a claim past the capacity was granted or evicted (%d items left)", s.Stats().Items)
	}
	s.Unclaim(2 * charge)
	if err := put(t, s, MakeKey(1, 9), item(9, size)); err != nil {
		t.Fatalf("after unclaim: %v", err)
	}
}

// A claim of exactly the capacity fits an empty store; claims add up with
// earlier ones; bytes of evicted items still being sent do not count
// against a claim; the items a claim evicts are counted.
func TestClaimBounds(t *testing.T) {
	const size = 1000
	charge := alignUp(size) + EntryOverhead
	s := mustNew(t, 4*charge, MinIO{})
	if !s.Claim(4 * charge) {
		t.Fatal("a claim of exactly the capacity refused in an empty store")
	}
	s.Unclaim(4 * charge)

	for i := range 4 {
		if err := put(t, s, MakeKey(1, uint32(i)), item(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	ref, ok := s.Get(MakeKey(1, 0))
	if !ok {
		t.Fatal("item 0 not held")
	}
	s.Delete(MakeKey(1, 0)) // evicted while being sent: dying, not in the budget
	if st := s.Stats(); st.Sending != charge || st.Items != 3 {
		t.Fatalf("sending %d, items %d; want %d and 3", st.Sending, st.Items, charge)
	}
	if !s.Claim(charge) || s.Stats().Items != 3 {
		t.Fatalf("a claim of the room a dying item frees evicted: %d items left, want 3", s.Stats().Items)
	}
	ref.Release()

	// 3 items and one item's claim fill the store: one more item's claim
	// evicts exactly one item, counted.
	before := s.Stats().Evicted
	if !s.Claim(charge) {
		t.Fatal("claim refused")
	}
	if st := s.Stats(); st.Items != 2 || st.Evicted != before+1 {
		t.Fatalf("after a second claim: %d items, %d evicted; want 2 and %d", st.Items, st.Evicted, before+1)
	}
}
