package store

import (
	"bytes"
	"encoding/binary"
	"os"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// mustNewShared is mustNew with the arena shared (NewShared).
func mustNewShared(t *testing.T, capacity uint64, p Policy) *Store {
	t.Helper()
	s, err := NewShared(capacity, p)
	return opened(t, s, err)
}

// readAt reads n bytes at off of the file another process would open.
func readAt(t *testing.T, path string, off, n uint64) []byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	b := make([]byte, n)
	if _, err := f.ReadAt(b, int64(off)); err != nil {
		t.Fatal(err)
	}
	return b
}

// genSum sums the generations of [off, off+n) as a reader does, from the
// generations' file.
func genSum(t *testing.T, path string, off, n uint64) uint64 {
	t.Helper()
	first, last := off/GenPage, (off+n-1)/GenPage
	b := readAt(t, path, first*4, (last-first+1)*4)
	var s uint64
	for i := 0; i < len(b); i += 4 {
		s += uint64(binary.LittleEndian.Uint32(b[i:]))
	}
	return s
}

// A shared arena's items read byte-exact through the paths another process
// opens, at the place Locate gives; once an item is gone, the generations of
// its pages have moved, so a reader that copied it from there can tell, and
// they move again when the extent is freed for the next item.
func TestSharedArenaLocateAndGenerations(t *testing.T) {
	s := mustNewShared(t, 1<<20, NewLRU())
	arena, gens, size, ok := s.SharedFiles()
	if !ok || size < 1<<20 {
		t.Fatalf("SharedFiles: %q %q %d %v", arena, gens, size, ok)
	}
	a, b := item(1, 3*GenPage+100), item(2, 5000)
	if err := put(t, s, MakeKey(1, 0), a); err != nil {
		t.Fatal(err)
	}
	if err := put(t, s, MakeKey(1, 1), b); err != nil {
		t.Fatal(err)
	}
	la, ok := s.Locate(MakeKey(1, 0))
	if !ok || la.Size != uint64(len(a)) {
		t.Fatalf("Locate: %+v %v", la, ok)
	}
	if got := readAt(t, arena, la.Off, la.Size); !bytes.Equal(got, a) {
		t.Fatal("the arena's file holds other bytes where Locate points")
	}
	if got := genSum(t, gens, la.Off, la.Size); got != la.Gens {
		t.Fatalf("generations %d read back, Locate said %d", got, la.Gens)
	}
	if _, ok := s.Locate(MakeKey(1, 9)); ok {
		t.Fatal("an item never put was located")
	}
	lb, _ := s.Locate(MakeKey(1, 1))
	// Deleting a leaves b's pages as they were (but for one they share).
	s.Delete(MakeKey(1, 0))
	if _, ok := s.Locate(MakeKey(1, 0)); ok {
		t.Fatal("a deleted item was located")
	}
	if got := genSum(t, gens, la.Off, la.Size); got == la.Gens {
		t.Fatal("the generations of a freed item's pages did not move")
	}
	shared := (la.Off+la.Size-1)/GenPage == lb.Off/GenPage
	if got := genSum(t, gens, lb.Off, lb.Size); (got == lb.Gens) == shared {
		t.Fatalf("b's generations %d (were %d), sharing a page with a: %v", got, lb.Gens, shared)
	}
	// A pinned item's pages move only when its last reader lets go.
	ref, _ := s.Get(MakeKey(1, 1))
	lb, _ = s.Locate(MakeKey(1, 1))
	s.Delete(MakeKey(1, 1))
	if got := genSum(t, gens, lb.Off, lb.Size); got != lb.Gens {
		t.Fatal("a pinned item's generations moved before its bytes were freed")
	}
	ref.Release()
	if got := genSum(t, gens, lb.Off, lb.Size); got == lb.Gens {
		t.Fatal("a released item's generations did not move")
	}
}

// An arena that is not shared locates nothing.
func TestPlainArenaLocatesNothing(t *testing.T) {
	s := mustNew(t, 1<<20, NewLRU())
	if err := put(t, s, MakeKey(1, 0), item(1, 100)); err != nil {
		t.Fatal(err)
	}
	if _, ok := s.Locate(MakeKey(1, 0)); ok {
		t.Fatal("a plain arena located an item")
	}
	if _, _, _, ok := s.SharedFiles(); ok {
		t.Fatal("a plain arena has shared files")
	}
}

// An item within one page has that page's generation as its sum, and it
// moves when the item is freed; so does an item on the arena's last page.
func TestGenerationsOfOnePageAndTheLastPage(t *testing.T) {
	s := mustNewShared(t, 1<<20, NewLRU())
	_, gens, _, _ := s.SharedFiles()
	if err := put(t, s, MakeKey(1, 0), item(1, 100)); err != nil {
		t.Fatal(err)
	}
	l, _ := s.Locate(MakeKey(1, 0))
	if (l.Off+l.Size-1)/GenPage != l.Off/GenPage {
		t.Fatalf("a 100-byte item spans pages: %+v", l)
	}
	s.Delete(MakeKey(1, 0))
	if got := genSum(t, gens, l.Off, l.Size); got == l.Gens {
		t.Fatal("a freed one-page item's generation did not move")
	}

	// The arena's very last page has a generation of its own (an arena of
	// 64 MiB and a bit: the generations take more than a page).
	const size = 16384*GenPage + 64
	mem, sf, err := mapShared(size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Munmap(mem); sf.close() })
	if len(sf.gens) != 16385 || len(sf.genMem) < 4*16385 {
		t.Fatalf("%d generations in %d bytes for %d bytes of arena, want 16385", len(sf.gens), len(sf.genMem), size)
	}
	before := sf.sum(size-1, 1)
	sf.freed(size-64, 64)
	if after := sf.sum(size-1, 1); after != before+1 || sf.sum(0, size-64) != 0 {
		t.Fatalf("the last page's generation: %d then %d; the others' sum %d", before, after, sf.sum(0, size-64))
	}
}

// Locate counts as an access, as Get does: the policy keeps a located item.
func TestLocateIsAnAccess(t *testing.T) {
	const size = 4096
	s := mustNewShared(t, uint64(3*(size+EntryOverhead)), NewLRU())
	for i := range 3 {
		put(t, s, MakeKey(1, uint32(i)), item(i, size))
	}
	if _, ok := s.Locate(MakeKey(1, 0)); !ok { // 0 becomes most recent; 1 is now least recent
		t.Fatal("not located")
	}
	if err := put(t, s, MakeKey(1, 3), item(3, size)); err != nil {
		t.Fatal(err)
	}
	if s.Contains(MakeKey(1, 1)) || !s.Contains(MakeKey(1, 0)) {
		t.Fatal("a located item was evicted as if never read")
	}
}

// What a loader opens cannot change the node's items: the memfds are
// sealed against writes and writable mappings from anyone but the node.
func TestSharedFilesAreReadOnlyToOthers(t *testing.T) {
	s := mustNewShared(t, 1<<20, NewLRU())
	if err := put(t, s, MakeKey(1, 0), item(1, 100)); err != nil {
		t.Fatal(err)
	}
	l, _ := s.Locate(MakeKey(1, 0))
	arena, gens, size, _ := s.SharedFiles()
	if seals, err := unix.FcntlInt(s.arena.shared.arenaFile.Fd(), unix.F_GET_SEALS, 0); err != nil || seals&unix.F_SEAL_FUTURE_WRITE == 0 {
		t.Skipf("this kernel (before Linux 5.1) has no F_SEAL_FUTURE_WRITE (seals %#x, %v): others can write to the memfd", seals, err)
	}
	for _, path := range []string{arena, gens} {
		f, err := os.OpenFile(path, os.O_RDWR, 0)
		if err != nil {
			continue // refused at open: read-only too
		}
		if _, err := f.WriteAt([]byte("x"), int64(l.Off)); err == nil {
			t.Errorf("%s: a write went through", path)
		}
		if m, err := syscall.Mmap(int(f.Fd()), 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED); err == nil {
			syscall.Munmap(m)
			t.Errorf("%s: mapped writable", path)
		}
		if err := f.Truncate(int64(size) / 2); err == nil {
			t.Errorf("%s: resized", path)
		}
		f.Close()
	}
	if ref, _ := s.Get(MakeKey(1, 0)); !bytes.Equal(ref.Data, item(1, 100)) {
		t.Fatal("the item changed")
	} else {
		ref.Release()
	}
}
