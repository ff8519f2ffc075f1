package catalog

import (
	"sync/atomic"

	"github.com/hashicorp/raft"
)

// CountLeaderChanges starts counting the times this member sees a new raft
// leader, and returns the count so far. The observer's filter does the
// counting and keeps every observation: nothing is queued, nothing needs
// draining, and raft never waits on it.
func (c *Catalog) CountLeaderChanges() func() uint64 {
	var n atomic.Uint64
	c.raft.RegisterObserver(raft.NewObserver(nil, false, func(o *raft.Observation) bool {
		if l, ok := o.Data.(raft.LeaderObservation); ok && l.LeaderID != "" {
			n.Add(1)
		}
		return false
	}))
	return n.Load
}
