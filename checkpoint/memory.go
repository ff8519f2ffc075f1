package checkpoint

import (
	"bytes"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"stallfree/catalog"
)

// memory holds parts outside the Go heap: each part is one anonymous
// mapping of exactly its size, so the collector never scans or copies
// checkpoint bytes and freeing a part returns its pages to the OS at once.
// The budget (--checkpoint-memory) counts reservations as well as stored
// parts, so a refused write is refused before any byte is read. Each
// reservation is also charged perPart for its bookkeeping (the index entry,
// its names, the held record), which lives on the Go heap: without it,
// parts of no bytes under ever new names cost nothing and grew the heap
// without bound.
type memory struct {
	limit   uint64
	perPart uint64

	mu    sync.Mutex
	used  uint64 // bytes of parts stored or reserved
	count uint64 // parts stored or reserved, each charged perPart
	parts map[partKey]*held
	// spare are mappings of freed parts kept for the next part of the same
	// size (a checkpoint's parts have the same sizes step after step): a
	// fresh mapping costs a page fault and a zeroed page per 4 KiB, which
	// measured as much as the hashing. charged() + spareBytes never exceeds
	// limit; spares are unmapped first when room is needed.
	spare      map[int64][][]byte
	spareBytes uint64
	// counted are parts a commit has counted (the leader asked for them
	// with forCommit), with the sum it was told and until when that holds:
	// until the commit shows in this node's catalog, only those bytes may be
	// stored under the part. Store and commit are thus decided under mu.
	counted map[partKey]countedPart

	// shmDir and shmPrefix, when set, back new mappings with files in
	// shared memory (shm.go); files holds the file behind each such
	// mapping. A mapping that could not be made there is anonymous, and
	// shmFailed reports the first failure once.
	shmDir, shmPrefix string
	files             map[*byte]*shmFile
	shmFailed         func(error)
}

type countedPart struct {
	sum   string
	until time.Time
}

// countedFor is how long a part stays as a commit counted it. The commit
// reaches this node's catalog well within it (a raft apply); after it, the
// committed sum is the rule.
const countedFor = 2 * time.Minute

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

// partOverhead is what a part is charged beyond its bytes: more than its
// bookkeeping costs on the heap (two names of at most 128 bytes, a map entry
// and a held record come to about 400 bytes), so that the budget bounds the
// heap the parts take too.
const partOverhead = 1 << 10

func newMemory(limit uint64) *memory {
	return &memory{limit: limit, perPart: partOverhead, parts: map[partKey]*held{}, spare: map[int64][][]byte{}, counted: map[partKey]countedPart{},
		files: map[*byte]*shmFile{}}
}

// inShm backs the mappings made from now on with files in dir, named with
// prefix; failed is told of the first one that could not be.
func (m *memory) inShm(dir, prefix string, failed func(error)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.shmDir, m.shmPrefix, m.shmFailed = dir, prefix, failed
}

// reserve takes size bytes of the budget and maps them (or reuses a spare
// mapping of that size).
func (m *memory) reserve(size int64) ([]byte, error) {
	m.mu.Lock()
	if size < 0 || m.charged()+uint64(size)+m.perPart > m.limit {
		used, count := m.used, m.count
		m.mu.Unlock()
		return nil, fmt.Errorf("%w: a part of %d bytes does not fit (%d bytes in %d parts of %d bytes, each part charged %d more)",
			ErrNoRoom, size, used, count, m.limit, m.perPart)
	}
	m.used += uint64(size)
	m.count++
	if l := m.spare[size]; len(l) > 0 {
		b := l[len(l)-1]
		m.spare[size] = l[:len(l)-1]
		m.spareBytes -= uint64(size)
		m.mu.Unlock()
		return b, nil
	}
	var victims []unmapping
	for sz, l := range m.spare {
		if m.charged()+m.spareBytes <= m.limit {
			break
		}
		for _, b := range l {
			victims = append(victims, m.forget(b))
		}
		m.spareBytes -= uint64(sz) * uint64(len(l))
		delete(m.spare, sz)
	}
	dir, prefix, failed := m.shmDir, m.shmPrefix, m.shmFailed
	m.mu.Unlock()
	for _, v := range victims {
		v.unmap()
	}
	if size == 0 {
		return []byte{}, nil
	}
	if dir != "" {
		b, path, err := mapShm(dir, prefix, size)
		if err == nil {
			m.mu.Lock()
			m.files[mapKey(b)] = &shmFile{path: path}
			m.mu.Unlock()
			return b, nil
		}
		if failed != nil {
			failed(err)
		}
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

// charged is the budget taken: parts' bytes and their bookkeeping. Caller
// holds mu.
func (m *memory) charged() uint64 { return m.used + m.count*m.perPart }

func (m *memory) unreserve(n uint64) {
	m.mu.Lock()
	m.used -= n
	m.count--
	m.mu.Unlock()
}

// free gives a buffer's room back; its mapping is kept as a spare, unless
// a reader on this host was given its file (share): that one is removed.
func (m *memory) free(b []byte) {
	m.mu.Lock()
	m.used -= uint64(len(b))
	m.count--
	if f := m.files[mapKey(b)]; f != nil && f.shared {
		gone := m.forget(b)
		m.mu.Unlock()
		gone.unmap()
		return
	}
	if len(b) > 0 {
		m.spare[int64(len(b))] = append(m.spare[int64(len(b))], b)
		m.spareBytes += uint64(len(b))
	}
	m.mu.Unlock()
}

// unmapping is a mapping to unmap and the file behind it ("" for none).
type unmapping struct {
	b    []byte
	path string
}

// forget takes b's file out of the index; the caller unmaps it. Caller
// holds mu.
func (m *memory) forget(b []byte) unmapping {
	u := unmapping{b: b}
	if f := m.files[mapKey(b)]; f != nil && len(b) > 0 {
		u.path = f.path
		delete(m.files, mapKey(b))
	}
	return u
}

func (u unmapping) unmap() {
	if u.path != "" {
		os.Remove(u.path)
	}
	if len(u.b) > 0 {
		syscall.Munmap(u.b)
	}
}

// share returns the file holding h's bytes, marking it never to be reused
// (free removes it instead); false when h is in anonymous memory.
func (m *memory) share(h *held) (string, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.files[mapKey(h.data)]
	if f == nil || len(h.data) == 0 {
		return "", false
	}
	f.shared = true
	return f.path, true
}

// unmapSpares unmaps every spare mapping (Close).
func (m *memory) unmapSpares() {
	m.mu.Lock()
	var gone []unmapping
	for _, l := range m.spare {
		for _, b := range l {
			gone = append(gone, m.forget(b))
		}
	}
	m.spare, m.spareBytes = map[int64][][]byte{}, 0
	m.mu.Unlock()
	for _, u := range gone {
		u.unmap()
	}
}

// settled says whether a part's step is committed in this node's catalog,
// and with which sum the part was committed ("" when the step lacks it).
type settled func(partKey) (sum string, committed bool)

// store publishes a filled buffer under k, replacing (and releasing) what
// was there, unless k is settled with other bytes: its step is committed
// with another sum, or a commit has counted other bytes under it
// (countedFor). Checked under mu, with the catalog read there, so no store
// slips between a commit's count and the part's replacement.
//
// A settled part this node holds is never replaced, even by bytes with its
// sum: a crc32c is no proof against bytes made to match it. Bytes equal to
// the held ones leave it as it is (a retry, or a repair that raced a copy
// already here); any others are a conflict. Only a settled part this node
// lacks, or holds with another sum (a stale copy), takes bytes with the
// settled sum: the repair of a lost copy.
func (m *memory) store(k partKey, b []byte, sum string, settledSum settled) error {
	h := &held{data: b, sum: sum, mem: m}
	h.refs.Store(1)
	m.mu.Lock()
	want, committed := settledSum(k)
	if committed && want != sum {
		m.mu.Unlock()
		return fmt.Errorf("%w: checkpoint %s step %d is committed (immutable)", catalog.ErrConflict, k.name, k.step)
	}
	c, counting := m.counted[k]
	counting = counting && time.Now().Before(c.until)
	if counting && c.sum != sum {
		m.mu.Unlock()
		return fmt.Errorf("%w: checkpoint %s step %d part %s is being committed with other bytes", catalog.ErrConflict, k.name, k.step, k.part)
	}
	old := m.parts[k]
	if old != nil && (committed || counting) && old.sum == sum {
		// Settled and held: compared outside the lock (a part can be
		// gigabytes), under a reference that keeps the held bytes alive.
		old.refs.Add(1)
		m.mu.Unlock()
		same := bytes.Equal(old.data, b)
		old.release()
		if !same { // b stays the caller's to free, as on every refusal
			return fmt.Errorf("%w: checkpoint %s step %d part %s is settled with other bytes of the same sum (immutable)",
				catalog.ErrConflict, k.name, k.step, k.part)
		}
		h.release() // the held copy stays; this buffer goes back
		return nil
	}
	m.parts[k] = h
	m.mu.Unlock()
	if old != nil {
		old.release()
	}
	return nil
}

// dropIf removes k when it holds sum (a copy found to differ from the
// committed bytes), and reports whether it did.
func (m *memory) dropIf(k partKey, sum string) bool {
	m.mu.Lock()
	h, ok := m.parts[k]
	if ok && h.sum == sum {
		delete(m.parts, k)
	}
	m.mu.Unlock()
	if ok && h.sum == sum {
		h.release()
		return true
	}
	return false
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
	for k := range m.counted {
		if f(k) {
			delete(m.counted, k)
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

// step lists the parts held of one step, with their sizes and sums. With
// forCommit the listing is a commit's count: each part listed keeps these
// bytes for countedFor (store).
func (m *memory) step(name string, step uint64, forCommit bool) []HeldPart {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := []HeldPart{}
	for k, h := range m.parts {
		if k.name == name && k.step == step {
			out = append(out, HeldPart{Part: k.part, Bytes: int64(len(h.data)), Sum: h.sum})
			if forCommit {
				m.counted[k] = countedPart{sum: h.sum, until: now.Add(countedFor)}
			}
		}
	}
	for k, c := range m.counted { // forget counts long over
		if now.After(c.until) {
			delete(m.counted, k)
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
