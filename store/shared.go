package store

import (
	"fmt"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A shared arena (NewShared) lives in a memfd rather than anonymous memory,
// so that loaders on this host map it read-only and copy an item from where
// it lies (Locate) instead of receiving it through a socket: one copy of
// each byte instead of two, and no per-item work in the node. Both memfds
// are sealed once mapped here: nobody else can write to them.
//
// Such a reader holds no pin: the node may free and reuse an item's extent
// while it copies. Every page of the arena therefore has a generation in a
// second shared memfd, which free bumps before the extent can be allocated
// again. Locate answers an item's place with the sum of its pages'
// generations; a reader copies the bytes, then sums the generations again:
// generations only grow, so an equal sum means no page of the item was freed
// between the answer and the end of the copy, and the bytes it copied are
// the item's. A different sum means the reader reads that item over the
// socket. (The reader's loads must not be reordered before its copy's:
// x86-64's ordering gives that; the Python reader maps only there.)

// GenPage is the span of arena bytes one generation covers.
const GenPage = 4096

// Location is where an item lies in a shared arena.
type Location struct {
	Off, Size uint64
	// Gens is the sum of the generations of the pages [Off, Off+Size)
	// touches, when Locate answered.
	Gens uint64
}

// sharedFiles are the memfds behind a shared arena and its generations.
type sharedFiles struct {
	arenaFile, gensFile *os.File
	genMem              []byte
	gens                []uint32
}

// mapShared maps size bytes of a new memfd, and the generations of its
// pages in another.
func mapShared(size uint64) ([]byte, *sharedFiles, error) {
	arena, mem, err := mapMemfd("stallfree-items", size)
	if err != nil {
		return nil, nil, err
	}
	pages := (size + GenPage - 1) / GenPage
	gens, genMem, err := mapMemfd("stallfree-item-gens", alignUp(pages*4))
	if err != nil {
		syscall.Munmap(mem)
		arena.Close()
		return nil, nil, err
	}
	sf := &sharedFiles{arenaFile: arena, gensFile: gens, genMem: genMem,
		gens: unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(genMem))), pages)}
	return mem, sf, nil
}

func mapMemfd(name string, size uint64) (*os.File, []byte, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, nil, fmt.Errorf("memfd_create: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if err := f.Truncate(int64(size)); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("sizing the memfd to %d bytes: %w", size, err)
	}
	mem, err := syscall.Mmap(fd, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("mapping the memfd: %w", err)
	}
	seal(fd)
	return f, mem, nil
}

// seal makes the memfd read-only to everyone but this process's mapping,
// made before: whoever opens /proc/PID/fd/N later can neither write to it
// nor map it writable, nor resize it (F_SEAL_FUTURE_WRITE, Linux 5.1). A
// kernel without that seal still gets the size fixed.
func seal(fd int) {
	fixed := unix.F_SEAL_SHRINK | unix.F_SEAL_GROW
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, fixed|unix.F_SEAL_FUTURE_WRITE|unix.F_SEAL_SEAL); err != nil {
		unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, fixed|unix.F_SEAL_SEAL)
	}
}

// freed bumps the generation of every page [off, off+n) touches. Called
// before the extent can be allocated again (arena.free).
func (sf *sharedFiles) freed(off, n uint64) {
	if n == 0 {
		return
	}
	for p := off / GenPage; p <= (off+n-1)/GenPage; p++ {
		atomic.AddUint32(&sf.gens[p], 1)
	}
}

// sum is the sum of the generations of the pages [off, off+n) touches.
func (sf *sharedFiles) sum(off, n uint64) uint64 {
	if n == 0 {
		return 0
	}
	var s uint64
	for p := off / GenPage; p <= (off+n-1)/GenPage; p++ {
		s += uint64(atomic.LoadUint32(&sf.gens[p]))
	}
	return s
}

func (sf *sharedFiles) close() {
	syscall.Munmap(sf.genMem)
	sf.gens, sf.genMem = nil, nil
	sf.arenaFile.Close()
	sf.gensFile.Close()
}

// SharedFiles are the paths a process on this host opens to map the arena
// and its generations (/proc/PID/fd/N of this process's memfds), and the
// arena's size; ok is false when the arena is not shared.
func (s *Store) SharedFiles() (arena, gens string, size uint64, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sf := s.arena.shared
	if sf == nil || s.arena.mem == nil {
		return "", "", 0, false
	}
	pid := os.Getpid()
	return fmt.Sprintf("/proc/%d/fd/%d", pid, sf.arenaFile.Fd()), fmt.Sprintf("/proc/%d/fd/%d", pid, sf.gensFile.Fd()),
		uint64(len(s.arena.mem)), true
}

// Locate is where a resident item lies in a shared arena, counted as an
// access like Get but not pinned (see above); ok is false when the item is
// not resident or the arena is not shared.
func (s *Store) Locate(k Key) (Location, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	sf := s.arena.shared
	i, ok := s.index[k]
	if !ok || sf == nil {
		return Location{}, false
	}
	sl := &s.slots[i]
	if sl.rpos == 0 {
		s.policy.Accessed(i, k)
	}
	return Location{Off: sl.off, Size: sl.size, Gens: sf.sum(sl.off, sl.size)}, true
}
