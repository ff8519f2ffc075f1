package store

import (
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/google/btree"
)

// align keeps every item on a cache-line boundary; it also bounds the number of
// distinct free-extent sizes, which keeps best-fit search cheap.
const align = 64

func alignUp(n uint64) uint64 { return (n + align - 1) &^ (align - 1) }

// pageSize is the unit prefault maps (the kernel's base page on the
// platforms the node runs on).
const pageSize = 4096

func alignPage(n uint64) uint64 { return (n + pageSize - 1) &^ (pageSize - 1) }

// arena is an off-heap region carved into variable-size extents. It lives in an
// anonymous mapping, so its bytes are invisible to the garbage collector and RSS
// grows only with the pages actually written.
type arena struct {
	mem []byte
	// shared, when set, holds the memfds behind mem and its pages'
	// generations (shared.go); nil for an anonymous arena.
	shared    *sharedFiles
	bySize    *btree.BTreeG[extent]
	byOff     map[uint64]uint64 // free extent start -> length
	byEnd     map[uint64]uint64 // free extent end -> start
	freeBytes uint64
	// noPopulate is set once the kernel has refused MADV_POPULATE_WRITE
	// (before Linux 5.14): prefault is not asked again.
	noPopulate bool
	// ahead maps pages past the highest extent handed out, outside the
	// store's lock (ahead.go), up to aheadLimit; made at the first handedOut.
	ahead      *populator
	aheadLimit uint64
}

// handedOut tells the arena that [off, off+n) was handed out to be
// written: the pages past it, up to room bytes, are mapped ahead, off the
// caller's path.
func (a *arena) handedOut(off, n, room uint64) {
	if a.noPopulate {
		return
	}
	if a.ahead == nil {
		a.ahead = newPopulator(a.mem, a.aheadLimit)
	}
	a.ahead.reached(off+n, room)
}

// prefault maps the pages of [off, off+n) in one call before they are
// written (MADV_POPULATE_WRITE): on pages never touched, or given back,
// that costs less than a fault per page, and on pages already mapped
// little. It is only a hint: the write that follows faults in whatever it
// did not map.
func (a *arena) prefault(off, n uint64) {
	if a.noPopulate || n == 0 || (a.ahead != nil && off+n <= a.ahead.done.Load()) {
		return // nothing to map, or mapped ahead already: no call under the lock
	}
	lo, hi := off&^(pageSize-1), min(alignPage(off+n), uint64(len(a.mem)))
	if err := unix.Madvise(a.mem[lo:hi], unix.MADV_POPULATE_WRITE); errors.Is(err, unix.EINVAL) {
		a.noPopulate = true
	}
}

type extent struct{ off, n uint64 }

func lessBySize(a, b extent) bool {
	if a.n != b.n {
		return a.n < b.n
	}
	return a.off < b.off
}

func newArena(size uint64) (*arena, error) { return newArenaIn(size, false) }

// newArenaIn maps an arena of size bytes: anonymous, or with shared in a
// memfd that loaders on this host may map (shared.go).
func newArenaIn(size uint64, shared bool) (*arena, error) {
	size = alignUp(size)
	if size == 0 {
		size = align
	}
	var (
		mem []byte
		sf  *sharedFiles
		err error
	)
	if shared {
		mem, sf, err = mapShared(size)
	} else {
		mem, err = syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE|syscall.MAP_NORESERVE)
	}
	if err != nil {
		return nil, fmt.Errorf("store: reserve %d bytes: %w", size, err)
	}
	// Items are read at random across the whole arena: huge pages cut the TLB
	// misses of serving them (advice only; ignored where THP is off, and for
	// a memfd unless shmem_enabled allows it).
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
	a := &arena{
		mem:    mem,
		shared: sf,
		bySize: btree.NewG(16, lessBySize),
		byOff:  make(map[uint64]uint64),
		byEnd:  make(map[uint64]uint64),
	}
	a.insertFree(0, size)
	a.aheadLimit = size
	return a, nil
}

func (a *arena) close() error {
	if a.mem == nil {
		return nil
	}
	if a.ahead != nil {
		a.ahead.stop() // before the unmap: it touches the arena's pages
		a.ahead = nil
	}
	err := syscall.Munmap(a.mem)
	a.mem = nil
	if a.shared != nil {
		a.shared.close()
		a.shared = nil
	}
	return err
}

// alloc returns the offset of n free bytes (n already aligned) using best fit,
// which keeps large holes intact for large items.
func (a *arena) alloc(n uint64) (uint64, bool) {
	var found extent
	ok := false
	a.bySize.AscendGreaterOrEqual(extent{n: n}, func(e extent) bool {
		found, ok = e, true
		return false
	})
	if !ok {
		return 0, false
	}
	a.removeFree(found)
	if found.n > n {
		a.insertFree(found.off+n, found.n-n)
	}
	return found.off, true
}

// free returns an extent and merges it with free neighbours so that churn does
// not fragment the arena into pieces too small for the next item.
func (a *arena) free(off, n uint64) {
	if a.shared != nil {
		a.shared.freed(off, n) // before the extent can be handed out again
	}
	if start, ok := a.byEnd[off]; ok {
		prev := extent{start, a.byOff[start]}
		a.removeFree(prev)
		off, n = prev.off, prev.n+n
	}
	if nextN, ok := a.byOff[off+n]; ok {
		a.removeFree(extent{off + n, nextN})
		n += nextN
	}
	a.insertFree(off, n)
}

func (a *arena) insertFree(off, n uint64) {
	a.bySize.ReplaceOrInsert(extent{off, n})
	a.byOff[off] = n
	a.byEnd[off+n] = off
	a.freeBytes += n
}

func (a *arena) removeFree(e extent) {
	a.bySize.Delete(e)
	delete(a.byOff, e.off)
	delete(a.byEnd, e.off+e.n)
	a.freeBytes -= e.n
}
