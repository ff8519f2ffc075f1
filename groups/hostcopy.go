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
// read a batch about together, and is bounded by maxHostCopyBytes.

// maxHostCopyBytes bounds the bytes of relayed batches a node keeps.
const maxHostCopyBytes = 512 << 20

// hostCopyLife is how long a host keeps a relayed batch for its other jobs:
// they may read it well after the first (a window apart), unlike a reader
// told a file's path, who opens it at once (Config.Linger).
const hostCopyLife = 30 * time.Second

type hostCopy struct {
	Staged
	until time.Time
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
// the copy; a batch over the bound is not kept (false), one kept already is
// returned as it is.
func (s *Service) KeepHostCopy(group string, version, epoch uint64, index int, data []byte) (Staged, bool) {
	k := copyKey{group, version, epoch, index}
	s.mu.Lock()
	old, had := s.copies[k]
	room := s.copyBytes+int64(len(data)) <= maxHostCopyBytes
	s.mu.Unlock()
	if had {
		return old.Staged, true
	}
	if !room {
		return Staged{}, false
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
	s.copies[k] = c
	s.copyBytes += c.Size
	return c.Staged, true
}

// expireCopies drops the copies whose time is up (every one when now is
// zero). Caller holds s.mu.
func (s *Service) expireCopies(now time.Time) {
	for k, c := range s.copies {
		if now.IsZero() || now.After(c.until) {
			if c.Path != "" {
				// A job may be about to open it: the same linger as a
				// dropped batch's file.
				s.linger = append(s.linger, lingering{path: c.Path, at: now.Add(s.cfg.Linger)})
			}
			delete(s.copies, k)
			s.copyBytes -= c.Size
		}
	}
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
