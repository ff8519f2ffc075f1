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
