package checkpoint

import (
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
)

// memory holds parts outside the Go heap: each part is one anonymous
// mapping of exactly its size, so the collector never scans or copies
// checkpoint bytes and freeing a part returns its pages to the OS at once.
// The budget (--checkpoint-memory) counts reservations as well as stored
// parts, so a refused write is refused before any byte is read.
type memory struct {
	limit uint64

	mu    sync.Mutex
	used  uint64
	parts map[partKey]*held
	// spare are mappings of freed parts kept for the next part of the same
	// size (a checkpoint's parts have the same sizes step after step): a
	// fresh mapping costs a page fault and a zeroed page per 4 KiB, which
	// measured as much as the hashing. used + spareBytes never exceeds
	// limit; spares are unmapped first when room is needed.
	spare      map[int64][][]byte
	spareBytes uint64
}

type partKey struct {
	name string
	step uint64
	part string
}

// held is a stored part. refs counts the index's reference and every reader;
// the mapping is released when the last one lets go.
type held struct {
	data []byte
	sum  string
	refs atomic.Int32
	mem  *memory
}

func newMemory(limit uint64) *memory {
	return &memory{limit: limit, parts: map[partKey]*held{}, spare: map[int64][][]byte{}}
}

// reserve takes size bytes of the budget and maps them (or reuses a spare
// mapping of that size).
func (m *memory) reserve(size int64) ([]byte, error) {
	m.mu.Lock()
	if size < 0 || m.used+uint64(size) > m.limit {
		used := m.used
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: a part of %d bytes does not fit (%d of %d bytes in use)", ErrNoRoom, size, used, m.limit)
	}
	m.used += uint64(size)
	if l := m.spare[size]; len(l) > 0 {
		b := l[len(l)-1]
		m.spare[size] = l[:len(l)-1]
		m.spareBytes -= uint64(size)
		m.mu.Unlock()
		return b, nil
	}
	var victims [][]byte
	for sz, l := range m.spare {
		if m.used+m.spareBytes <= m.limit {
			break
		}
		victims = append(victims, l...)
		m.spareBytes -= uint64(sz) * uint64(len(l))
		delete(m.spare, sz)
	}
	m.mu.Unlock()
	for _, v := range victims {
		syscall.Munmap(v)
	}
	if size == 0 {
		return []byte{}, nil
	}
	b, err := syscall.Mmap(-1, 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		m.unreserve(uint64(size))
		return nil, fmt.Errorf("%w: mmap %d bytes: %w", ErrNoRoom, size, err)
	}
	// No MADV_HUGEPAGE: measured, zeroing and compacting huge pages made a
	// 256 MiB PUT two to three times slower than 4 KiB page faults.
	return b, nil
}

func (m *memory) unreserve(n uint64) {
	m.mu.Lock()
	m.used -= n
	m.mu.Unlock()
}

// free gives a buffer's room back; its mapping is kept as a spare.
func (m *memory) free(b []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.used -= uint64(len(b))
	if len(b) > 0 {
		m.spare[int64(len(b))] = append(m.spare[int64(len(b))], b)
		m.spareBytes += uint64(len(b))
	}
}

// unmapSpares unmaps every spare mapping (Close).
func (m *memory) unmapSpares() {
	m.mu.Lock()
	spare := m.spare
	m.spare, m.spareBytes = map[int64][][]byte{}, 0
	m.mu.Unlock()
	for _, l := range spare {
		for _, b := range l {
			syscall.Munmap(b)
		}
	}
}

// store publishes a filled buffer under k, replacing (and releasing) what
// was there.
func (m *memory) store(k partKey, b []byte, sum string) {
	h := &held{data: b, sum: sum, mem: m}
	h.refs.Store(1)
	m.mu.Lock()
	old := m.parts[k]
	m.parts[k] = h
	m.mu.Unlock()
	if old != nil {
		old.release()
	}
}

// get returns the part with a reference the caller must release.
func (m *memory) get(k partKey) (*held, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	h, ok := m.parts[k]
	if ok {
		h.refs.Add(1)
	}
	return h, ok
}

func (h *held) release() {
	if h.refs.Add(-1) == 0 {
		h.mem.free(h.data)
	}
}

// drop removes the parts for which f is true.
func (m *memory) drop(f func(partKey) bool) int {
	m.mu.Lock()
	var gone []*held
	for k, h := range m.parts {
		if f(k) {
			gone = append(gone, h)
			delete(m.parts, k)
		}
	}
	m.mu.Unlock()
	for _, h := range gone {
		h.release()
	}
	return len(gone)
}

func (m *memory) dropAll() {
	m.drop(func(partKey) bool { return true })
	m.unmapSpares()
}

// keys lists what is held.
func (m *memory) keys() []partKey {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]partKey, 0, len(m.parts))
	for k := range m.parts {
		out = append(out, k)
	}
	return out
}

// step lists the parts held of one step, with their sizes and sums.
func (m *memory) step(name string, step uint64) []HeldPart {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []HeldPart
	for k, h := range m.parts {
		if k.name == name && k.step == step {
			out = append(out, HeldPart{Part: k.part, Bytes: int64(len(h.data)), Sum: h.sum})
		}
	}
	return out
}

func (m *memory) usage() (uint64, int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.used, len(m.parts)
}

// HeldPart is one part a node holds (the internal listing a commit gathers).
type HeldPart struct {
	Part  string `json:"part"`
	Bytes int64  `json:"bytes"`
	Sum   string `json:"sum"`
}
