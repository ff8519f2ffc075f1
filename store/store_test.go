package store

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"

	"stallfree/internal/testutil"
)

func item(i, size int) []byte {
	b := make([]byte, size)
	r := rand.New(rand.NewPCG(uint64(i), 7))
	for j := range b {
		b[j] = byte(r.Uint32())
	}
	return b
}

func mustNew(t *testing.T, capacity uint64, p Policy) *Store {
	t.Helper()
	s, err := New(capacity, p)
	return opened(t, s, err)
}

// opened fails the test on err, and closes s when the test ends.
func opened(t *testing.T, s *Store, err error) *Store {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func put(t *testing.T, s *Store, k Key, b []byte) error {
	t.Helper()
	return s.Put(k, b, xxhash.Sum64(b))
}

func TestPutGetByteExact(t *testing.T) {
	s := mustNew(t, 1<<20, MinIO{})
	for i := range 50 {
		if err := put(t, s, MakeKey(1, uint32(i)), item(i, 1000+i)); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 50 {
		r, ok := s.Get(MakeKey(1, uint32(i)))
		if !ok {
			t.Fatalf("item %d missing", i)
		}
		if !bytes.Equal(r.Data, item(i, 1000+i)) {
			t.Fatalf("item %d differs", i)
		}
		r.Release()
	}
	if _, ok := s.Get(MakeKey(2, 0)); ok {
		t.Fatal("other dataset's key found")
	}
	st := s.Stats()
	if st.Items != 50 || st.Used > st.Capacity {
		t.Fatalf("stats %+v", st)
	}
}

func TestChecksumRejected(t *testing.T) {
	s := mustNew(t, 1<<20, MinIO{})
	b := item(1, 100)
	if err := s.Put(MakeKey(1, 1), b, xxhash.Sum64(b)+1); !errors.Is(err, ErrChecksum) {
		t.Fatalf("got %v", err)
	}
	if s.Contains(MakeKey(1, 1)) || s.Stats().Used != 0 {
		t.Fatal("rejected item changed the store")
	}
}

func TestMinIOFillsThenBypasses(t *testing.T) {
	const size = 4096
	capacity := uint64(10 * (size + EntryOverhead))
	s := mustNew(t, capacity, MinIO{})
	admitted := 0
	for i := range 20 {
		err := put(t, s, MakeKey(1, uint32(i)), item(i, size))
		switch {
		case err == nil:
			admitted++
		case !errors.Is(err, ErrNotAdmitted):
			t.Fatal(err)
		}
	}
	if admitted != 10 {
		t.Fatalf("admitted %d, want 10", admitted)
	}
	for i := range 10 {
		if !s.Contains(MakeKey(1, uint32(i))) {
			t.Fatalf("MinIO evicted item %d", i)
		}
	}
}

func TestLRUEvictsLeastRecent(t *testing.T) {
	const size = 4096
	s := mustNew(t, uint64(3*(size+EntryOverhead)), NewLRU())
	for i := range 3 {
		put(t, s, MakeKey(1, uint32(i)), item(i, size))
	}
	r, _ := s.Get(MakeKey(1, 0)) // 0 becomes most recent; 1 is now least recent
	r.Release()
	if err := put(t, s, MakeKey(1, 3), item(3, size)); err != nil {
		t.Fatal(err)
	}
	if s.Contains(MakeKey(1, 1)) || !s.Contains(MakeKey(1, 0)) || !s.Contains(MakeKey(1, 3)) {
		t.Fatal("LRU evicted the wrong item")
	}
}

func TestPinnedBytesSurviveEviction(t *testing.T) {
	const size = 4096
	s := mustNew(t, uint64(2*(size+EntryOverhead)), NewLRU())
	want := item(0, size)
	put(t, s, MakeKey(1, 0), want)
	ref, _ := s.Get(MakeKey(1, 0))
	put(t, s, MakeKey(1, 1), item(1, size))
	// Room for a third item only exists by evicting 0, which is pinned: its bytes
	// must stay intact until released, and count as memory still being sent.
	if err := put(t, s, MakeKey(1, 2), item(2, size)); err != nil {
		t.Fatal(err)
	}
	if s.Contains(MakeKey(1, 0)) {
		t.Fatal("evicted item still indexed")
	}
	if !bytes.Equal(ref.Data, want) {
		t.Fatal("pinned bytes overwritten")
	}
	if st := s.Stats(); st.Used-st.Sending > st.Capacity || st.Sending != size+EntryOverhead {
		t.Fatalf("accounting while sending: %+v", st)
	}
	ref.Release()
	if st := s.Stats(); st.Used > st.Capacity || st.Sending != 0 {
		t.Fatalf("after release: %+v", st)
	}
	if err := put(t, s, MakeKey(1, 3), item(3, size)); err != nil {
		t.Fatal(err)
	}
}

func TestChurnKeepsBudgetAndContent(t *testing.T) {
	testutil.Long(t)
	s := mustNew(t, 1<<20, NewLRU())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), 2))
			for n := range 2000 {
				i := int(r.Uint32() % 500)
				sz := 100 + (i*37)%30000
				k := MakeKey(1, uint32(i))
				if ref, ok := s.Get(k); ok {
					if !bytes.Equal(ref.Data, item(i, sz)) {
						t.Errorf("item %d corrupted after %d ops", i, n)
					}
					ref.Release()
					continue
				}
				b := item(i, sz)
				if err := s.Put(k, b, xxhash.Sum64(b)); err != nil {
					t.Error(err)
				}
			}
		}()
	}
	wg.Wait()
	st := s.Stats()
	if st.Used-st.Sending > st.Capacity || st.Evicted == 0 {
		t.Fatalf("stats %+v", st)
	}
	for _, k := range []uint32{1, 2} {
		s.DeleteDataset(k)
	}
	if st := s.Stats(); st.Items != 0 || st.Used != 0 {
		t.Fatalf("after delete: %+v", st)
	}
	if st := s.Stats(); st.Sending != 0 {
		t.Fatalf("nothing is being sent, yet %d bytes count as sending", st.Sending)
	}
	if s.arena.freeBytes != uint64(len(s.arena.mem)) || s.arena.bySize.Len() != 1 {
		t.Fatalf("free extents did not coalesce: %d extents", s.arena.bySize.Len())
	}
}
