// Package catchup decides when a node's catalog may answer reads: once it
// holds at least what the leader's held when the node first asked, so that a
// restarted node never answers with an empty or partial list while its raft
// log is still catching up.
package catchup

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// Source is what the gate looks at: the index the catalog must reach, and
// the index it has applied.
type Source interface {
	// Target is the index this node's catalog must apply before it answers:
	// the leader's applied index (this node's own last log index when it
	// leads). An error means it cannot be learnt yet (no leader, leader
	// unreachable): the gate asks again.
	Target(ctx context.Context) (uint64, error)
	// LocalTarget is the target when it needs no network (this node leads),
	// so a leader opens the moment it has applied its log, not at Run's next
	// tick.
	LocalTarget() (uint64, bool)
	// AppliedIndex is raft's count of entries applied (for the reason).
	AppliedIndex() uint64
	// HasApplied reports whether the catalog holds every change up to
	// index: raft counts an entry applied when it hands it to the FSM, a
	// batch ahead of what the catalog holds just after a start, so
	// AppliedIndex alone would open the gate on an empty catalog.
	HasApplied(index uint64) bool
}

// Gate latches open once the catalog has applied the target it learnt at
// start: later lag (a write not yet replicated) is the ordinary lag of a
// raft follower, not a catalog that is still being rebuilt.
type Gate struct {
	src Source

	mu     sync.Mutex
	target uint64
	known  bool
	open   bool
	why    string
}

// New returns a closed gate; Run opens it.
func New(src Source) *Gate {
	return &Gate{src: src, why: "catalog not yet compared with the raft leader's"}
}

// Run asks for the target every interval until it has one (or ctx ends).
func (g *Gate) Run(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		target, err := g.src.Target(tctx)
		cancel()
		g.mu.Lock()
		if g.known { // learnt meanwhile by Ready
			g.mu.Unlock()
			return
		}
		if err == nil {
			g.target, g.known = target, true
			g.mu.Unlock()
			return
		}
		g.why = "catalog not yet compared with the raft leader's: " + err.Error()
		g.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Ready reports whether catalog reads may be answered; when not, reason says
// why (for a 503's error and /readyz).
func (g *Gate) Ready() (ok bool, reason string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.open {
		return true, ""
	}
	if !g.known {
		if t, ok := g.src.LocalTarget(); ok {
			g.target, g.known = t, true
		} else {
			return false, g.why
		}
	}
	if applied := g.src.AppliedIndex(); applied < g.target || !g.src.HasApplied(g.target) {
		return false, fmt.Sprintf("catalog catching up with the raft leader (applied %d of %d)", applied, g.target)
	}
	g.open = true
	return true, ""
}
