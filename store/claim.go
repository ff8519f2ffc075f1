package store

// Claim charges n bytes held outside the store (a group's staged batches)
// against the budget, so that --memory bounds them too. Room is made by
// evicting the policy's victims and, when the policy keeps everything (MinIO
// once full), any unpinned item: a staged batch is wanted within moments by
// jobs that are waiting for it, while a cached item can be read from storage
// again. False when n cannot fit even in an empty store (nothing is evicted
// then).
func (s *Store) Claim(n uint64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.reservedN+n > s.capacity {
		return false // could not fit with every item gone: evict nothing
	}
	for s.used-s.dying+s.reservedN+n > s.capacity {
		victim, ok := s.victim(Key(^uint64(0))) // recomputable items first
		if !ok || !s.slots[victim].live {
			if victim, ok = s.anyVictim(); !ok {
				return false
			}
		}
		s.evict(victim)
		s.evicted++
	}
	s.reservedN += n
	s.claimed += n
	return true
}

// Unclaim gives back n bytes of an earlier Claim.
func (s *Store) Unclaim(n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n = min(n, s.claimed)
	s.claimed -= n
	s.reservedN -= n
}

// anyVictim is some live item, for when the policy proposes none.
func (s *Store) anyVictim() (uint32, bool) {
	for _, i := range s.index {
		return i, true
	}
	return 0, false
}
