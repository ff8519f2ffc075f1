package groups

import (
	"fmt"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// One crossing per host: a node that relays a group read to the group's
// owner on another host keeps the batch it got back (in shared memory when
// it has a ShmDir), and the next jobs on its host that read the same batch
// get this copy. Only the fact of their read crosses to the owner (a
// "record" read: the owner counts it and sends no bytes), so the owner's
// accounting — who has read what, the window, detachment — stays the one
// truth. A copy lives hostCopyLife, long enough for the jobs of a host to
// read a batch about together. Their bytes are bounded by
// Config.MaxHostCopyBytes: past it the oldest copies go first, as a group
// moves on from them.

// DefaultMaxHostCopyBytes bounds the bytes of relayed batches a node keeps.
const DefaultMaxHostCopyBytes = 512 << 20

// hostCopyLife is how long a host keeps a relayed batch for its other jobs:
// they may read it well after the first (a window apart), unlike a reader
// told a file's path, who opens it at once (Config.Linger).
const hostCopyLife = 30 * time.Second

type hostCopy struct {
	Staged
	until time.Time
	seq   uint64
}

type copyEntry struct {
	key copyKey
	seq uint64
}

// A copy is keyed by the version of the group's definition too: a group
// deleted and defined again stages other batches under the same numbers.
type copyKey struct {
	group   string
	version uint64
	epoch   uint64
	index   int
}

// HostCopy is this node's copy of a batch of the group's definition version
// that it relayed before, if it still has one.
func (s *Service) HostCopy(group string, version, epoch uint64, index int) (Staged, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	c, ok := s.copies[copyKey{group, version, epoch, index}]
	if !ok || time.Now().After(c.until) {
		return Staged{}, false
	}
	s.copyHits.Add(1)
	return c.Staged, true
}

// KeepHostCopy keeps a batch relayed from its owner (staged under the
// group's definition version) for the other jobs on this host, and returns
// the copy; one kept already is returned as it is. To make room the oldest
// copies go: a bound that refused new copies instead (as it did) stopped
// keeping any once a group relayed more than the bound in a copy's life
// (512 MiB in 30 s: 17 MB/s, two batches of 500x375 images a second), and
// every job of the host then had each batch cross again. A batch larger
// than the bound itself is not kept (false).
func (s *Service) KeepHostCopy(group string, version, epoch uint64, index int, data []byte) (Staged, bool) {
	if int64(len(data)) > s.cfg.MaxHostCopyBytes {
		return Staged{}, false
	}
	k := copyKey{group, version, epoch, index}
	s.mu.Lock()
	old, had := s.copies[k]
	s.mu.Unlock()
	if had {
		return old.Staged, true
	}
	c := hostCopy{Staged: Staged{Size: int64(len(data)), Version: version}, until: time.Now().Add(hostCopyLife)}
	if s.cfg.ShmDir != "" {
		if path, err := s.writeShm(fmt.Sprintf("copy-%s", group), epoch<<20|uint64(index), data); err == nil {
			c.Path = path
		}
	}
	if c.Path == "" {
		c.Data = append([]byte(nil), data...)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if old, had := s.copies[k]; had { // another relay kept it meanwhile
		if c.Path != "" {
			os.Remove(c.Path)
		}
		return old.Staged, true
	}
	s.dropOldestCopies(time.Now(), func(hostCopy) bool { return s.copyBytes+c.Size > s.cfg.MaxHostCopyBytes })
	s.copySeq++
	c.seq = s.copySeq
	s.copies[k] = c
	s.copyBytes += c.Size
	s.copyOrder = append(s.copyOrder, copyEntry{k, c.seq})
	return c.Staged, true
}

// dropOldestCopies drops copies, oldest first, while drop says so of the
// oldest. Caller holds s.mu.
func (s *Service) dropOldestCopies(now time.Time, drop func(hostCopy) bool) {
	for len(s.copyOrder) > 0 {
		e := s.copyOrder[0]
		c, ok := s.copies[e.key]
		if ok && c.seq == e.seq {
			if !drop(c) {
				return
			}
			s.dropCopy(e.key, now)
		}
		s.copyOrder[0] = copyEntry{}
		s.copyOrder = s.copyOrder[1:]
	}
	s.copyOrder = nil // empty: let go of the array
}

// expireCopies drops the copies whose time is up (every one when now is
// zero). Caller holds s.mu.
func (s *Service) expireCopies(now time.Time) {
	s.dropOldestCopies(now, func(c hostCopy) bool { return now.IsZero() || now.After(c.until) })
}

// dropCopy forgets copy k; its file lingers. Caller holds s.mu.
func (s *Service) dropCopy(k copyKey, now time.Time) {
	c := s.copies[k]
	if c.Path != "" {
		// A job may be about to open it: the same linger as a dropped
		// batch's file.
		s.linger = append(s.linger, lingering{path: c.Path, at: now.Add(s.cfg.Linger)})
	}
	delete(s.copies, k)
	s.copyBytes -= c.Size
}

// HostCopyHits counts reads answered from a host copy (no bytes crossed).
func (s *Service) HostCopyHits() uint64 { return s.copyHits.Load() }

var copyHitsDesc = prometheus.NewDesc("stallfree_group_host_copy_hits_total",
	"Group reads this node answered from its host's copy of a batch relayed before (only the read crossed to the owner).", nil, nil)

// Describe and Collect make the service a prometheus.Collector.
func (s *Service) Describe(ch chan<- *prometheus.Desc) { ch <- copyHitsDesc }

func (s *Service) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(copyHitsDesc, prometheus.CounterValue, float64(s.copyHits.Load()))
}
