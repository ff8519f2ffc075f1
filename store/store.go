// Package store keeps cached items in an off-heap arena under a byte budget.
//
// The index is pointer-free (map[uint64]uint32 into a slice of plain structs), so
// millions of items cost the garbage collector nothing to scan. Items are
// immutable once stored. A reader pins an item with Get and unpins it with
// Release; an item evicted while pinned keeps its bytes until the last reader
// lets go, so a response being written is never overwritten. Such bytes no
// longer count against admission (the policy chose to drop them, and making
// the next eviction wait for a slow client would evict a second item), so
// memory can exceed the budget by what is being sent at that moment
// (Stats.Sending), within slack reserved for it.
package store

import (
	"errors"
	"fmt"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// EntryOverhead is what one cached item costs beyond its payload: the slot
// struct, its map bucket share and the policy's bookkeeping. It is charged to the
// budget so that --memory bounds what the process really holds.
const EntryOverhead = 128

var (
	// ErrChecksum means the bytes offered do not match their checksum.
	ErrChecksum = errors.New("store: checksum mismatch")
	// ErrNotAdmitted means the policy declined the item (the cache is full and
	// nothing may be evicted for it). The caller serves it uncached.
	ErrNotAdmitted = errors.New("store: not admitted")
)

// Key identifies an item: the dataset's catalog id in the high 32 bits and the
// item's manifest index in the low 32 bits.
type Key uint64

// MakeKey builds the key of item index in dataset id.
func MakeKey(dataset uint32, index uint32) Key { return Key(uint64(dataset)<<32 | uint64(index)) }

// Dataset returns the dataset id part of k.
func (k Key) Dataset() uint32 { return uint32(k >> 32) }

// Index returns the manifest index part of k.
func (k Key) Index() uint32 { return uint32(k) }

// Policy decides what is admitted and what is evicted. Implementations are
// called with the store lock held and must not call back into the store.
type Policy interface {
	Name() string
	Added(slot uint32, k Key)
	Accessed(slot uint32, k Key)
	Removed(slot uint32, k Key)
	// Victim proposes a resident item to evict so that incoming fits; ok=false
	// means incoming is not admitted.
	Victim(incoming Key) (slot uint32, ok bool)
}

type slot struct {
	key   Key
	off   uint64
	size  uint64
	alloc uint64
	sum   uint64
	pins  int32
	live  bool // in the index; false once evicted (bytes freed at last Release)
	inUse bool
	// rpos is the slot's place in Store.recomp plus one (0: not recomputable).
	rpos uint32
}

// Store is safe for concurrent use.
type Store struct {
	mu       sync.Mutex
	capacity uint64
	used     uint64 // allocated payload bytes + EntryOverhead per slot in use
	// dying is the part of used held by evicted items still being sent: it is
	// free as far as admission goes (the policy chose to drop them), and the
	// arena has slack so their extents can outlive the eviction.
	dying    uint64
	payload  uint64
	items    int
	arena    *arena
	index    map[Key]uint32
	slots    []slot
	freeSlot []uint32
	policy   Policy
	evicted  uint64
	// reserved holds room MakeRoom cleared for a coming Put of that key, so
	// that no other item takes it meanwhile.
	reserved  map[Key]uint64
	reservedN uint64
	quotas    quotas // per-dataset limits (quota.go)
	// claimed is the part of reservedN held outside the store (claim.go).
	claimed uint64
	// recomputable are the datasets whose items can be made again by whoever
	// wrote them (a prep cache's derived items): they are evicted before any
	// other item, and kept out of the policy's sight. recomp lists their
	// resident slots.
	recomputable map[uint32]bool
	recomp       []uint32
	usage        map[uint32]Usage
}

// Usage is what one dataset holds in the store.
type Usage struct {
	Items int
	Bytes uint64
}

// Stats is a snapshot of the store's accounting.
type Stats struct {
	Items    int
	Bytes    uint64 // payload bytes of resident items
	Used     uint64 // bytes charged against the budget
	Capacity uint64
	Evicted  uint64
	Policy   string
	// Sending is the part of Used held by evicted items still being sent.
	Sending uint64
}

// New reserves capacity bytes and returns an empty store governed by p.
func New(capacity uint64, p Policy) (*Store, error) { return newStore(capacity, p, false) }

// NewShared is New with the arena in a memfd that loaders on this host may
// map read-only (shared.go: Locate, SharedFiles).
func NewShared(capacity uint64, p Policy) (*Store, error) { return newStore(capacity, p, true) }

func newStore(capacity uint64, p Policy, shared bool) (*Store, error) {
	// The slack covers extents of evicted items that are still being sent
	// (pinned); it is address space, not memory, until used.
	a, err := newArenaIn(capacity+max(capacity/8, 64<<20), shared)
	if err != nil {
		return nil, err
	}
	a.aheadLimit = alignUp(capacity) // the slack stays unmapped until used
	return &Store{capacity: capacity, arena: a, index: make(map[Key]uint32), policy: p, reserved: map[Key]uint64{},
		recomputable: map[uint32]bool{}, usage: map[uint32]Usage{}}, nil
}

// Close releases the arena. Refs still held become invalid.
func (s *Store) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.arena.close()
}

// Ref is a pinned view of a stored item. Data must not be used after Release.
type Ref struct {
	s    *Store
	slot uint32
	Data []byte
	Sum  uint64
}

// Release unpins the item. It is safe to call on a zero Ref.
func (r *Ref) Release() {
	if r.s == nil {
		return
	}
	r.s.mu.Lock()
	r.s.unpin(r.slot)
	r.s.mu.Unlock()
	r.s, r.Data = nil, nil
}

// Get pins and returns the item, or ok=false when it is not resident.
func (s *Store) Get(k Key) (Ref, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.index[k]
	if !ok {
		return Ref{}, false
	}
	sl := &s.slots[i]
	sl.pins++
	if sl.rpos == 0 {
		s.policy.Accessed(i, k)
	}
	return Ref{s: s, slot: i, Data: s.arena.mem[sl.off : sl.off+sl.size : sl.off+sl.size], Sum: sl.sum}, true
}

// Contains reports whether k is resident without counting an access.
func (s *Store) Contains(k Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.index[k]
	return ok
}

// Retrack tells the policy again that k was accessed, without pinning it:
// for a policy whose idea of k's next use changed after the access was
// counted (the clairvoyant policy learns of a use after the store lookup).
func (s *Store) Retrack(k Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if i, ok := s.index[k]; ok && s.slots[i].rpos == 0 {
		s.policy.Accessed(i, k)
	}
}

// Put stores a copy of data under k after checking it against sum. Storing a
// key that is already resident is a no-op (items are immutable).
func (s *Store) Put(k Key, data []byte, sum uint64) error {
	if xxhash.Sum64(data) != sum {
		return ErrChecksum
	}
	return s.put(k, data, sum)
}

// PutSummed is Put for bytes the caller holds whole and has not summed:
// the store sums them, once, where Put would check a sum the caller had
// just computed from the same bytes. It returns the sum.
func (s *Store) PutSummed(k Key, data []byte) (uint64, error) {
	sum := xxhash.Sum64(data)
	return sum, s.put(k, data, sum)
}

func (s *Store) put(k Key, data []byte, sum uint64) error {
	need := alignUp(uint64(len(data)))
	if need == 0 {
		need = align
	}
	charge := need + EntryOverhead
	if charge > s.capacity {
		return ErrNotAdmitted
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.arena.mem == nil {
		return errors.New("store: closed")
	}
	if _, ok := s.index[k]; ok {
		return nil
	}
	s.unreserve(k) // this Put is what the room was kept for
	if !s.quotas.admits(k, uint64(len(data))) {
		return ErrNotAdmitted
	}
	var off uint64
	for {
		if s.used-s.dying+s.reservedN+charge <= s.capacity {
			var ok bool
			if off, ok = s.arena.alloc(need); ok {
				break
			}
		}
		victim, ok := s.victim(k)
		if !ok {
			return ErrNotAdmitted
		}
		if !s.slots[victim].live {
			return fmt.Errorf("store: policy %s proposed a dead slot", s.policy.Name())
		}
		s.evict(victim)
		s.evicted++
	}
	s.arena.prefault(off, uint64(len(data)))
	// Ahead, no more than the budget has room for after this item: what
	// the budget also counts (each item's overhead, claims) holds no pages.
	s.arena.handedOut(off, need, s.capacity-(s.used-s.dying+s.reservedN+charge))
	copy(s.arena.mem[off:off+uint64(len(data))], data)
	i := s.newSlot()
	s.slots[i] = slot{key: k, off: off, size: uint64(len(data)), alloc: need, sum: sum, live: true, inUse: true}
	s.index[k] = i
	s.used += charge
	s.payload += uint64(len(data))
	s.items++
	s.quotas.add(k, uint64(len(data)))
	u := s.usage[k.Dataset()]
	u.Items++
	u.Bytes += uint64(len(data))
	s.usage[k.Dataset()] = u
	if s.recomputable[k.Dataset()] {
		s.recomp = append(s.recomp, i)
		s.slots[i].rpos = uint32(len(s.recomp))
	} else {
		s.policy.Added(i, k)
	}
	return nil
}

// victim picks what to evict for incoming: a recomputable item first, so
// that what only storage can give back stays longest. A recomputable item
// never evicts another (with every epoch a fresh permutation, trading one
// for another only churns, as LRU does); it is admitted into free room or
// not at all.
func (s *Store) victim(incoming Key) (uint32, bool) {
	if s.recomputable[incoming.Dataset()] {
		return 0, false
	}
	if n := len(s.recomp); n > 0 {
		return s.recomp[n-1], true
	}
	return s.policy.Victim(incoming)
}

// MarkRecomputable makes dataset id's items recomputable: evicted before
// any other item and never the reason another is evicted. Items it already
// holds are not affected; mark a dataset before its first Put.
func (s *Store) MarkRecomputable(id uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.recomputable[id] = true
}

// RecomputableDatasets lists the datasets marked recomputable.
func (s *Store) RecomputableDatasets() []uint32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]uint32, 0, len(s.recomputable))
	for id := range s.recomputable {
		out = append(out, id)
	}
	return out
}

// Usage returns what each dataset holds, by dataset id.
func (s *Store) Usage() map[uint32]Usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[uint32]Usage, len(s.usage))
	for id, u := range s.usage {
		out[id] = u
	}
	return out
}

// Delete evicts k if resident (readers holding it keep their bytes).
func (s *Store) Delete(k Key) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, ok := s.index[k]
	if ok {
		s.evict(i)
	}
	return ok
}

// DeleteDataset evicts every item of dataset id and returns how many.
func (s *Store) DeleteDataset(id uint32) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for k, i := range s.index {
		if k.Dataset() == id {
			s.evict(i)
			n++
		}
	}
	delete(s.recomputable, id)
	delete(s.usage, id)
	return n
}

// Stats returns the store's accounting.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Stats{Items: s.items, Bytes: s.payload, Used: s.used, Capacity: s.capacity, Evicted: s.evicted, Policy: s.policy.Name(), Sending: s.dying}
}

func (s *Store) newSlot() uint32 {
	if n := len(s.freeSlot); n > 0 {
		i := s.freeSlot[n-1]
		s.freeSlot = s.freeSlot[:n-1]
		return i
	}
	s.slots = append(s.slots, slot{})
	return uint32(len(s.slots) - 1)
}

func (s *Store) evict(i uint32) {
	sl := &s.slots[i]
	delete(s.index, sl.key)
	if sl.rpos > 0 {
		// Swap-remove from recomp; the moved slot learns its new place.
		last := s.recomp[len(s.recomp)-1]
		s.recomp[sl.rpos-1] = last
		s.slots[last].rpos = sl.rpos
		s.recomp = s.recomp[:len(s.recomp)-1]
		sl.rpos = 0
	} else {
		s.policy.Removed(i, sl.key)
	}
	sl.live = false
	s.items--
	s.payload -= sl.size
	s.quotas.sub(sl.key, sl.size)
	if u, ok := s.usage[sl.key.Dataset()]; ok {
		u.Items--
		u.Bytes -= sl.size
		if u.Items == 0 {
			delete(s.usage, sl.key.Dataset())
		} else {
			s.usage[sl.key.Dataset()] = u
		}
	}
	if sl.pins == 0 {
		s.reclaim(i)
	} else {
		s.dying += sl.alloc + EntryOverhead
	}
}

func (s *Store) unpin(i uint32) {
	sl := &s.slots[i]
	sl.pins--
	if sl.pins == 0 && !sl.live {
		s.dying -= sl.alloc + EntryOverhead
		s.reclaim(i)
	}
}

// reclaim returns an evicted, unpinned slot's bytes; only then is its charge
// lifted, so the budget also covers items that are gone but still being sent.
func (s *Store) reclaim(i uint32) {
	sl := &s.slots[i]
	if s.arena.mem != nil {
		s.arena.free(sl.off, sl.alloc)
	}
	s.used -= sl.alloc + EntryOverhead
	*sl = slot{}
	s.freeSlot = append(s.freeSlot, i)
}

// Rebuilder is implemented by policies whose priorities change wholesale
// (the clairvoyant policy at an epoch boundary).
type Rebuilder interface{ Rebuild() }

// Reprioritize lets the policy recompute every resident item's priority.
func (s *Store) Reprioritize() {
	rb, ok := s.policy.(Rebuilder)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	rb.Rebuild()
}

// MakeRoom evicts what the policy proposes until an item of size bytes under
// k fits, and keeps that room for k's Put. A prefetcher calls it before
// spending a storage read, so concurrent read-aheads each find their own room
// and no other Put takes it; Unreserve gives it back if the read fails.
func (s *Store) MakeRoom(k Key, size int) bool {
	charge := alignUp(uint64(max(size, 1))) + EntryOverhead
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.index[k]; ok || charge > s.capacity || !s.quotas.admits(k, uint64(max(size, 1))) {
		return false
	}
	if _, ok := s.reserved[k]; ok {
		return true
	}
	for s.used-s.dying+s.reservedN+charge > s.capacity {
		victim, ok := s.victim(k)
		if !ok || !s.slots[victim].live {
			return false
		}
		s.evict(victim)
		s.evicted++
	}
	s.reserved[k] = charge
	s.reservedN += charge
	return true
}

// Unreserve releases room MakeRoom kept for k.
func (s *Store) Unreserve(k Key) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.unreserve(k)
}

func (s *Store) unreserve(k Key) {
	if c, ok := s.reserved[k]; ok {
		delete(s.reserved, k)
		s.reservedN -= c
	}
}
