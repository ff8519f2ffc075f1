package store

import (
	"errors"
	"testing"
)

// Each dataset stays within its limit while the store fills; shrinking a
// limit evicts only that dataset's items, down to the limit; growing it
// admits the next misses.
func TestDatasetLimits(t *testing.T) {
	const size = 1000
	s := mustNew(t, 200*(size+EntryOverhead), MinIO{})
	// fill offers every item of both datasets not held, as an epoch's misses
	// would, and returns how many of each were admitted.
	fill := func() (admitted [3]int) {
		for i := range 100 {
			for _, ds := range []uint32{1, 2} {
				if s.Contains(MakeKey(ds, uint32(i))) {
					continue // a hit, not a miss
				}
				err := put(t, s, MakeKey(ds, uint32(i)), item(int(ds)*1000+i, size))
				switch {
				case err == nil:
					admitted[ds]++
				case !errors.Is(err, ErrNotAdmitted):
					t.Fatal(err)
				}
			}
		}
		return admitted
	}
	held := func(ds uint32) (n int) {
		for i := range 100 {
			if s.Contains(MakeKey(ds, uint32(i))) {
				n++
			}
		}
		return n
	}
	s.SetLimit(1, 30*size)
	s.SetLimit(2, 60*size+size/2) // half an item of slack is not an item
	fill()
	if got := s.DatasetBytes(1); got != 30*size || held(1) != 30 {
		t.Fatalf("dataset 1 holds %d bytes (%d items); want exactly its limit, 30 items", got, held(1))
	}
	if got := s.DatasetBytes(2); got != 60*size || held(2) != 60 {
		t.Fatalf("dataset 2 holds %d bytes (%d items); want 60 items", got, held(2))
	}

	// Shrink dataset 2: random items of it go, dataset 1 keeps all it had.
	if n := s.SetLimit(2, 25*size); n != 35 {
		t.Fatalf("shrinking evicted %d items; want 35", n)
	}
	if held(2) != 25 || s.DatasetBytes(2) != 25*size || held(1) != 30 {
		t.Fatalf("after shrinking: dataset 2 holds %d items (%d bytes), dataset 1 %d; want 25 and 30", held(2), s.DatasetBytes(2), held(1))
	}
	if st := s.Stats(); st.Items != 55 || st.Bytes != 55*size {
		t.Fatalf("store holds %d items, %d bytes after shrinking; want 55", st.Items, st.Bytes)
	}

	// Grow dataset 1: nothing is evicted, misses fill it to the new limit.
	if n := s.SetLimit(1, 70*size); n != 0 {
		t.Fatalf("growing evicted %d items", n)
	}
	if got := fill(); got[1] != 40 || got[2] != 0 {
		t.Fatalf("after growing, a pass admitted %d items of dataset 1 and %d of dataset 2; want 40 and 0", got[1], got[2])
	}
	if held(1) != 70 || held(2) != 25 {
		t.Fatalf("after growing: %d and %d items held; want 70 and 25", held(1), held(2))
	}
	// A limit of zero holds nothing; MakeRoom refuses too.
	s.SetLimit(1, 0)
	if held(1) != 0 || s.DatasetBytes(1) != 0 || s.MakeRoom(MakeKey(1, 0), size) {
		t.Fatalf("a zero limit: %d items held, MakeRoom allowed", held(1))
	}
	s.ClearLimit(1)
	if got := fill(); got[1] != 100 {
		t.Fatalf("with the limit lifted a pass admitted %d of 100 items", got[1])
	}
}

// An evicted item still being sent no longer counts against its dataset's
// limit (the dataset's count follows the index, as the policy's does).
func TestLimitCountsResidentOnly(t *testing.T) {
	const size = 512
	s := mustNew(t, 10*(size+EntryOverhead), MinIO{})
	s.SetLimit(3, 2*size)
	put(t, s, MakeKey(3, 0), item(0, size))
	put(t, s, MakeKey(3, 1), item(1, size))
	ref, ok := s.Get(MakeKey(3, 0))
	if !ok {
		t.Fatal("item 0 not held")
	}
	defer ref.Release()
	if !s.Delete(MakeKey(3, 0)) {
		t.Fatal("delete")
	}
	if err := put(t, s, MakeKey(3, 2), item(2, size)); err != nil {
		t.Fatalf("room freed by a pinned eviction not given to the dataset: %v", err)
	}
	if err := put(t, s, MakeKey(3, 3), item(3, size)); !errors.Is(err, ErrNotAdmitted) {
		t.Fatalf("a third item under a two-item limit: %v", err)
	}
}

// SetLimit says how many items it evicted; a limit at exactly what the
// dataset holds evicts none. What each dataset holds (Usage) follows
// evictions, and a dataset holding nothing has no entry.
func TestSetLimitCountsAndUsage(t *testing.T) {
	const size = 512
	s := mustNew(t, 20*(size+EntryOverhead), MinIO{})
	for i := range 10 {
		if err := put(t, s, MakeKey(3, uint32(i)), item(i, size)); err != nil {
			t.Fatal(err)
		}
	}
	if err := put(t, s, MakeKey(4, 0), item(99, size)); err != nil {
		t.Fatal(err)
	}
	if n := s.SetLimit(3, 10*size); n != 0 || s.Usage()[3].Items != 10 {
		t.Fatalf("a limit of exactly what is held evicted %d", n)
	}
	before := s.Stats().Evicted
	if n := s.SetLimit(3, 4*size); n != 6 {
		t.Fatalf("SetLimit evicted %d, says it; want 6", n)
	}
	if got := s.Stats().Evicted - before; got != 6 {
		t.Fatalf("the store counts %d evictions for the limit's 6", got)
	}
	if u := s.Usage()[3]; u.Items != 4 || u.Bytes != 4*size {
		t.Fatalf("usage after the limit: %+v, want 4 items of %d bytes", u, 4*size)
	}
	if n := s.DeleteDataset(3); n != 4 {
		t.Fatalf("DeleteDataset removed %d, want 4", n)
	}
	if u, ok := s.Usage()[3]; ok {
		t.Fatalf("a dataset holding nothing is still in Usage: %+v", u)
	}
	if u := s.Usage()[4]; u.Items != 1 || u.Bytes != size {
		t.Fatalf("the other dataset: %+v", u)
	}
	// Its count starts again from nothing: a limit of two items admits two.
	s.SetLimit(3, 2*size)
	for i := range 3 {
		err := put(t, s, MakeKey(3, uint32(i)), item(i, size))
		if (i < 2) != (err == nil) {
			t.Fatalf("item %d under a two-item limit after the dataset was emptied: %v", i, err)
		}
	}
}
