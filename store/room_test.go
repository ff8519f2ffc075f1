package store

import (
	"errors"
	"testing"
)

// Room kept by MakeRoom is not taken by another Put: that Put evicts
// instead, and the reserved Put then fits without evicting anything.
func TestReservedRoomIsKept(t *testing.T) {
	const size = 4096
	s := mustNew(t, uint64(2*(size+EntryOverhead)), NewLRU())
	a, b, c := MakeKey(1, 0), MakeKey(1, 1), MakeKey(1, 2)
	put(t, s, a, item(0, size))
	if !s.MakeRoom(b, size) {
		t.Fatal("no room made in a half-empty store")
	}
	if s.Stats().Evicted != 0 {
		t.Fatal("room was made by evicting in a half-empty store")
	}
	if err := put(t, s, c, item(2, size)); err != nil {
		t.Fatal(err)
	}
	if s.Contains(a) || !s.Contains(c) || s.Stats().Evicted != 1 {
		t.Fatalf("a Put beside a reservation: a held %v, c held %v, %d evicted; want a evicted for c", s.Contains(a), s.Contains(c), s.Stats().Evicted)
	}
	if err := put(t, s, b, item(1, size)); err != nil {
		t.Fatal(err)
	}
	if !s.Contains(b) || !s.Contains(c) || s.Stats().Evicted != 1 {
		t.Fatal("the reserved Put evicted instead of using its room")
	}
	if s.MakeRoom(b, size) {
		t.Fatal("room made for an item already held")
	}
	if s.MakeRoom(MakeKey(1, 9), 3*size) {
		t.Fatal("room made for an item larger than the store")
	}
	// Room given back is room again: a reservation then Unreserve leaves
	// the next Put its place.
	d := MakeKey(1, 3)
	if !s.MakeRoom(d, size) || s.Stats().Evicted != 2 {
		t.Fatal("no room made by evicting in a full store")
	}
	s.Unreserve(d)
	if err := put(t, s, MakeKey(1, 4), item(4, size)); err != nil || s.Stats().Evicted != 2 {
		t.Fatalf("after Unreserve a Put evicted again (err %v, %d evicted)", err, s.Stats().Evicted)
	}
}

// An item whose charge is exactly the capacity is admitted, one byte more is
// not; the evictions it takes are counted.
func TestExactFitAdmitted(t *testing.T) {
	const size = 4096
	s := mustNew(t, size+EntryOverhead, NewLRU())
	if err := put(t, s, MakeKey(1, 0), item(0, size)); err != nil {
		t.Fatalf("an item filling the store exactly: %v", err)
	}
	if err := put(t, s, MakeKey(1, 1), item(1, size)); err != nil || s.Stats().Evicted != 1 || s.Contains(MakeKey(1, 0)) {
		t.Fatalf("the second exact fit: err %v, %d evicted", err, s.Stats().Evicted)
	}
	if err := put(t, s, MakeKey(1, 2), item(2, size+1)); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("an item past the capacity: %v, want ErrNotAdmitted", err)
	}
}

// DeleteDataset removes that dataset's items, counts them, and leaves the
// others.
func TestDeleteDatasetLeavesOthers(t *testing.T) {
	s := mustNew(t, 1<<20, NewLRU())
	for i := range 3 {
		put(t, s, MakeKey(1, uint32(i)), item(i, 100))
	}
	for i := range 2 {
		put(t, s, MakeKey(2, uint32(i)), item(10+i, 100))
	}
	if n := s.DeleteDataset(1); n != 3 {
		t.Fatalf("deleted %d items of dataset 1, want 3", n)
	}
	if s.Contains(MakeKey(1, 0)) || !s.Contains(MakeKey(2, 0)) || !s.Contains(MakeKey(2, 1)) || s.Stats().Items != 2 {
		t.Fatalf("after deleting dataset 1: %+v", s.Stats())
	}
}

// A closed store refuses Puts; closing twice is harmless.
func TestClosedStoreRefuses(t *testing.T) {
	s, err := New(1<<20, NewLRU())
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := put(t, s, MakeKey(1, 0), item(0, 100)); err == nil {
		t.Fatal("a closed store admitted an item")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// An allocation that uses a free extent exactly leaves no empty extent
// behind.
func TestArenaExactFitLeavesNoHole(t *testing.T) {
	a, err := newArena(4 * align)
	if err != nil {
		t.Fatal(err)
	}
	defer a.close()
	if _, ok := a.alloc(4 * align); !ok {
		t.Fatal("the whole arena could not be allocated")
	}
	if a.bySize.Len() != 0 || len(a.byOff) != 0 || len(a.byEnd) != 0 || a.freeBytes != 0 {
		t.Fatalf("a full arena keeps %d free extents (%d bytes)", a.bySize.Len(), a.freeBytes)
	}
}

// MakeRoom charges what Put will: in a store with room for one item and a
// little more, making room for a second evicts the first; bytes evicted
// but still pinned are not counted twice; an exact fit gets its room.
func TestMakeRoomChargesLikePut(t *testing.T) {
	const size = 4096
	charge := uint64(size + EntryOverhead)
	s := mustNew(t, 2*charge-100, NewLRU())
	a := MakeKey(1, 0)
	put(t, s, a, item(0, size))
	if !s.MakeRoom(MakeKey(1, 1), size) || s.Contains(a) || s.Stats().Evicted != 1 {
		t.Fatalf("room for a second item of %d bytes: a held %v, %d evicted; want a evicted", size, s.Contains(a), s.Stats().Evicted)
	}

	s = mustNew(t, 2*charge, NewLRU())
	b := MakeKey(1, 1)
	put(t, s, a, item(0, size))
	put(t, s, b, item(1, size))
	ref, _ := s.Get(a)
	defer ref.Release()
	s.Delete(a) // evicted while pinned: its bytes are still charged, once
	if !s.MakeRoom(MakeKey(1, 2), size) || !s.Contains(b) || s.Stats().Evicted != 0 {
		t.Fatalf("room beside a pinned eviction: b held %v, %d evicted; want room without evicting b", s.Contains(b), s.Stats().Evicted)
	}

	s = mustNew(t, charge, NewLRU())
	if !s.MakeRoom(a, size) {
		t.Fatal("no room made for an item filling the store exactly")
	}
}

// Two reservations made before either Put each count against the budget:
// the second one evicts, and both Puts then fit without evicting more.
func TestReservationsCountTogether(t *testing.T) {
	const size = 4096
	s := mustNew(t, uint64(2*(size+EntryOverhead)), NewLRU())
	a, b, c := MakeKey(1, 0), MakeKey(1, 1), MakeKey(1, 2)
	put(t, s, a, item(0, size))
	if !s.MakeRoom(b, size) || s.Stats().Evicted != 0 {
		t.Fatal("the first reservation in a half-empty store evicted or failed")
	}
	if !s.MakeRoom(c, size) {
		t.Fatal("no room made for the second reservation")
	}
	if s.Contains(a) || s.Stats().Evicted != 1 {
		t.Fatalf("the second reservation ignored the first: a held %v, %d evicted", s.Contains(a), s.Stats().Evicted)
	}
	for i, k := range []Key{b, c} {
		if err := put(t, s, k, item(i+1, size)); err != nil {
			t.Fatal(err)
		}
	}
	if !s.Contains(b) || !s.Contains(c) || s.Stats().Evicted != 1 {
		t.Fatalf("the reserved Puts evicted again: %d evicted", s.Stats().Evicted)
	}
}
