package store

import "fmt"

// NewPolicy returns the named policy. Clairvoyant is built by the node
// package, which owns the job schedule it needs.
func NewPolicy(name string) (Policy, error) {
	switch name {
	case "", "minio":
		return MinIO{}, nil
	case "lru":
		return NewLRU(), nil
	}
	return nil, fmt.Errorf("store: unknown policy %q (want minio, lru or clairvoyant)", name)
}

// MinIO admits items until the budget is full and then never evicts. With one
// uniformly random pass over the dataset per epoch, its hit rate equals
// capacity/dataset, the best any policy without knowledge of the future gets;
// LRU under the same access pattern thrashes.
type MinIO struct{}

func (MinIO) Name() string              { return "minio" }
func (MinIO) Added(uint32, Key)         {}
func (MinIO) Accessed(uint32, Key)      {}
func (MinIO) Removed(uint32, Key)       {}
func (MinIO) Victim(Key) (uint32, bool) { return 0, false }

const none = ^uint32(0)

// LRU evicts the least recently used item. It is kept for contrast with MinIO.
// The list lives in slot-indexed arrays, so it adds no pointers for the GC.
type LRU struct {
	prev, next []uint32
	head, tail uint32 // head = most recent
}

// NewLRU returns an empty LRU policy.
func NewLRU() *LRU { return &LRU{head: none, tail: none} }

func (l *LRU) Name() string { return "lru" }

func (l *LRU) grow(i uint32) {
	for uint32(len(l.prev)) <= i {
		l.prev = append(l.prev, none)
		l.next = append(l.next, none)
	}
}

func (l *LRU) pushFront(i uint32) {
	l.prev[i], l.next[i] = none, l.head
	if l.head != none {
		l.prev[l.head] = i
	}
	l.head = i
	if l.tail == none {
		l.tail = i
	}
}

func (l *LRU) unlink(i uint32) {
	p, n := l.prev[i], l.next[i]
	if p != none {
		l.next[p] = n
	} else {
		l.head = n
	}
	if n != none {
		l.prev[n] = p
	} else {
		l.tail = p
	}
	l.prev[i], l.next[i] = none, none
}

func (l *LRU) Added(i uint32, _ Key) { l.grow(i); l.pushFront(i) }

func (l *LRU) Accessed(i uint32, _ Key) {
	if l.head != i {
		l.unlink(i)
		l.pushFront(i)
	}
}

func (l *LRU) Removed(i uint32, _ Key) { l.unlink(i) }

func (l *LRU) Victim(Key) (uint32, bool) { return l.tail, l.tail != none }
