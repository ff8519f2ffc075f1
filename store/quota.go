package store

import "math/rand/v2"

// quotas bound the payload bytes each dataset may hold in this store (a
// dataset's per-node share of its cluster-wide quota). The counts are kept
// for every dataset, with or without a limit, so that setting one knows at
// once how much is over. Guarded by the store's lock.
type quotas struct {
	held  map[uint32]uint64 // payload bytes resident, by dataset id
	limit map[uint32]uint64 // by dataset id; absent = no limit
}

func (q *quotas) add(k Key, n uint64) {
	if q.held == nil {
		q.held = map[uint32]uint64{}
	}
	q.held[k.Dataset()] += n
}

func (q *quotas) sub(k Key, n uint64) {
	id := k.Dataset()
	left := q.held[id] - min(n, q.held[id])
	if left == 0 {
		delete(q.held, id) // a dataset holding nothing has no entry
		return
	}
	q.held[id] = left
}

// admits reports whether n more payload bytes of k's dataset stay within
// its limit. A refused item is served uncached, as MinIO serves an item
// that finds the store full: the dataset keeps what it holds.
func (q *quotas) admits(k Key, n uint64) bool {
	lim, ok := q.limit[k.Dataset()]
	return !ok || q.held[k.Dataset()]+n <= lim
}

// SetLimit bounds the payload bytes dataset id may hold here to limit. When
// it holds more, items of that dataset chosen at random are evicted until
// it fits: with a uniformly shuffled epoch every cached item is as likely to
// be read next, so which ones go does not matter, and a random choice keeps
// what stays an unbiased sample (MinIO's hit rate stays cached/dataset).
// Raising a limit evicts nothing; misses fill the room as they come.
// It returns how many items were evicted.
func (s *Store) SetLimit(id uint32, limit uint64) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.quotas.limit == nil {
		s.quotas.limit = map[uint32]uint64{}
	}
	s.quotas.limit[id] = limit
	// A limit at or over what the dataset holds evicts nothing: the loop
	// below stops before its first eviction (a quota changes rarely, so
	// the scan of the index costs little).
	var slots []uint32
	for k, i := range s.index {
		if k.Dataset() == id {
			slots = append(slots, i)
		}
	}
	rand.Shuffle(len(slots), func(a, b int) { slots[a], slots[b] = slots[b], slots[a] })
	n := 0
	for _, i := range slots {
		if s.quotas.held[id] <= limit {
			break
		}
		s.evict(i)
		s.evicted++
		n++
	}
	return n
}

// ClearLimit lifts dataset id's limit.
func (s *Store) ClearLimit(id uint32) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.quotas.limit, id)
}

// Limit returns dataset id's limit here, if it has one.
func (s *Store) Limit(id uint32) (uint64, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lim, ok := s.quotas.limit[id]
	return lim, ok
}

// DatasetBytes returns the payload bytes dataset id holds here.
func (s *Store) DatasetBytes(id uint32) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quotas.held[id]
}
