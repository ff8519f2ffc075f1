package store

import (
	"bytes"
	"testing"
	"unsafe"

	"github.com/cespare/xxhash/v2"
	"golang.org/x/sys/unix"

	"stallfree/internal/testutil"
)

// resident lists which of the arena's first n pages are in memory.
func resident(t *testing.T, a *arena, n int) []bool {
	t.Helper()
	vec := make([]byte, n)
	if _, _, errno := unix.Syscall(unix.SYS_MINCORE, uintptr(unsafe.Pointer(&a.mem[0])), uintptr(n*pageSize), uintptr(unsafe.Pointer(&vec[0]))); errno != 0 {
		t.Skipf("mincore: %v", errno)
	}
	out := make([]bool, n)
	for i, v := range vec {
		out[i] = v&1 == 1
	}
	return out
}

// pastHugePage is the first page of a at or after page i that starts a
// huge page (2 MiB, by address): the arena is advised for huge pages, so
// the kernel may map the whole one a mapped page falls in.
func pastHugePage(a *arena, i int) int {
	const huge = 2 << 20
	base := uintptr(unsafe.Pointer(&a.mem[0]))
	addr := base + uintptr(i)*pageSize
	return int((addr+huge-1)/huge*huge-base) / pageSize
}

// needPopulateWrite skips a test on a kernel without MADV_POPULATE_WRITE.
func needPopulateWrite(t *testing.T) {
	t.Helper()
	probe, err := unix.Mmap(-1, 0, pageSize, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	perr := unix.Madvise(probe, unix.MADV_POPULATE_WRITE)
	unix.Munmap(probe)
	if perr != nil {
		t.Skipf("this kernel has no MADV_POPULATE_WRITE (before Linux 5.14): %v", perr)
	}
}

// prefault maps exactly the pages a range touches, and nothing else, before
// anything is written there.
func TestPrefaultMapsTheRangesPages(t *testing.T) {
	needPopulateWrite(t)
	for _, shared := range []bool{false, true} {
		a, err := newArenaIn(64*pageSize, shared)
		if err != nil {
			t.Fatal(err)
		}
		defer a.close()
		a.prefault(3*pageSize+100, 2*pageSize) // touches pages 3, 4 and 5
		a.prefault(8*pageSize, 2*pageSize)     // exactly pages 8 and 9
		if a.noPopulate {
			t.Fatalf("shared %v: the kernel refused a range it supports", shared)
		}
		got := resident(t, a, 12)
		want := []bool{false, false, false, true, true, true, false, false, true, true, false, false}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("shared %v: resident pages %v, want %v", shared, got, want)
			}
		}
		a.prefault(63*pageSize+1, 10*pageSize) // past the end: clipped, no panic
		if !resident(t, a, 64)[63] {
			t.Fatalf("shared %v: the last page was not mapped", shared)
		}
	}
}

// PutSummed stores the bytes under the sum it computes, which is theirs.
func TestPutSummed(t *testing.T) {
	s := mustNew(t, 1<<20, NewLRU())
	data := bytes.Repeat([]byte("summed once "), 100)
	k := MakeKey(1, 7)
	sum, err := s.PutSummed(k, data)
	if err != nil || sum != xxhash.Sum64(data) {
		t.Fatalf("PutSummed: sum %x, %v; want %x", sum, err, xxhash.Sum64(data))
	}
	ref, ok := s.Get(k)
	if !ok {
		t.Fatal("not stored")
	}
	defer ref.Release()
	if !bytes.Equal(ref.Data, data) || ref.Sum != sum {
		t.Fatalf("stored %d bytes, sum %x", len(ref.Data), ref.Sum)
	}
}

// While a fresh store fills, the pages just past the highest extent handed
// out are mapped ahead of the puts (outside the lock), up to the budget and
// no further; a close stops it before the arena goes.
func TestPagesAreMappedAheadOfThePuts(t *testing.T) {
	needPopulateWrite(t)
	const capacity = 1 << 20 // 256 pages; the arena has 64 MiB of slack past them
	for _, shared := range []bool{false, true} {
		var s *Store
		if shared {
			s = mustNewShared(t, capacity, NewLRU())
		} else {
			s = mustNew(t, capacity, NewLRU())
		}
		pages := int(alignUp(capacity) / pageSize)
		if got := resident(t, s.arena, pages); got[0] || got[200] {
			t.Fatalf("shared %v: pages mapped before any put", shared)
		}
		data := bytes.Repeat([]byte{7}, 3*pageSize)
		if _, err := s.PutSummed(MakeKey(1, 0), data); err != nil {
			t.Fatal(err)
		}
		testutil.Await(t, "the pages up to the budget mapped", func() bool {
			got := resident(t, s.arena, pages)
			for i := range capacity / pageSize {
				if !got[i] {
					return false
				}
			}
			return true
		})
		past := pastHugePage(s.arena, capacity/pageSize)
		for i, r := range resident(t, s.arena, past+16)[past:] {
			if r {
				t.Fatalf("shared %v: page %d past the budget mapped ahead", shared, past+i)
			}
		}
		ref, ok := s.Get(MakeKey(1, 0))
		if !ok || !bytes.Equal(ref.Data, data) {
			t.Fatalf("shared %v: the item is not held as put", shared)
		}
		ref.Release()
		ahead := s.arena.ahead
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-ahead.exited:
		default:
			t.Fatalf("shared %v: the populator outlived the close", shared)
		}
	}
}

// Where the budget is larger, the pages are mapped aheadBytes past the
// highest extent handed out, all of them (chunk after chunk), and no further.
func TestPagesAreMappedAheadBytesAhead(t *testing.T) {
	needPopulateWrite(t)
	s := mustNew(t, 2*aheadBytes, NewLRU())
	data := bytes.Repeat([]byte{9}, 3*pageSize)
	if _, err := s.PutSummed(MakeKey(1, 0), data); err != nil {
		t.Fatal(err)
	}
	edge := int(alignPage(alignUp(uint64(len(data)))+aheadBytes) / pageSize) // the first page not to map
	testutil.Await(t, "the pages up to aheadBytes past the item mapped", func() bool {
		return resident(t, s.arena, edge)[edge-1]
	})
	// ...and the populator done with what it was asked for: whatever else
	// it maps is mapped by now.
	ahead := s.arena.ahead
	testutil.Await(t, "the populator done", func() bool { return ahead.done.Load() >= ahead.want.Load() })
	past := pastHugePage(s.arena, edge)
	got := resident(t, s.arena, past+64)
	for i := range edge {
		if !got[i] {
			t.Fatalf("page %d of the %d before the edge not mapped", i, edge)
		}
	}
	for i := past; i < past+64; i++ {
		if got[i] {
			t.Fatalf("page %d, past the edge (%d) and its huge page, mapped", i, edge)
		}
	}
}

// The frontier moves on with the puts: a put that ends past the pages
// mapped so far has the next aheadBytes past it mapped too.
func TestTheFrontierMovesWithThePuts(t *testing.T) {
	needPopulateWrite(t)
	s := mustNew(t, 4*aheadBytes, NewLRU())
	if _, err := s.PutSummed(MakeKey(1, 0), bytes.Repeat([]byte{1}, 3*pageSize)); err != nil {
		t.Fatal(err)
	}
	ahead := s.arena.ahead
	idle := func() bool { return ahead.done.Load() >= ahead.want.Load() }
	testutil.Await(t, "the first frontier mapped", idle)
	first := ahead.done.Load()
	big := bytes.Repeat([]byte{2}, int(first)+aheadBytes/4) // ends past the first frontier
	if _, err := s.PutSummed(MakeKey(1, 1), big); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "the second frontier mapped", idle)
	end := alignUp(alignUp(3*pageSize) + uint64(len(big)))
	edge := int(alignPage(end+aheadBytes) / pageSize)
	if got := ahead.done.Load(); got != uint64(edge)*pageSize {
		t.Fatalf("mapped up to %d, want %d (aheadBytes past the second item's end, %d)", got, edge*pageSize, end)
	}
	got := resident(t, s.arena, edge)
	for i := int(first / pageSize); i < edge; i++ {
		if !got[i] {
			t.Fatalf("page %d, between the first frontier and the second, not mapped", i)
		}
	}
	ref, ok := s.Get(MakeKey(1, 1))
	if !ok || !bytes.Equal(ref.Data, big) {
		t.Fatal("the second item is not held as put")
	}
	ref.Release()
}

// Ahead, never more than the budget has room for: bytes claimed outside
// the arena (a group's staged batches) and each item's overhead hold no
// pages, so the pages they stand for stay unmapped.
func TestNothingMappedAheadPastTheBudgetsRoom(t *testing.T) {
	needPopulateWrite(t)
	const capacity = 32 << 20
	s := mustNew(t, capacity, NewLRU())
	if !s.Claim(24 << 20) {
		t.Fatal("claim refused")
	}
	data := bytes.Repeat([]byte{3}, 3*pageSize)
	if _, err := s.PutSummed(MakeKey(1, 0), data); err != nil {
		t.Fatal(err)
	}
	ahead := s.arena.ahead
	testutil.Await(t, "the populator done", func() bool { return ahead.done.Load() >= ahead.want.Load() })
	end := alignUp(uint64(len(data)))
	room := uint64(capacity) - (24 << 20) - (end + EntryOverhead)
	edge := int(alignPage(end+room) / pageSize)
	if got := ahead.done.Load(); got != uint64(edge)*pageSize {
		t.Fatalf("mapped up to %d, want %d: the item's end %d and the budget's room %d", got, edge*pageSize, end, room)
	}
	past := pastHugePage(s.arena, edge)
	for i, r := range resident(t, s.arena, past+64)[past:] {
		if r {
			t.Fatalf("page %d, past the room's edge (%d), mapped", past+i, edge)
		}
	}
}
