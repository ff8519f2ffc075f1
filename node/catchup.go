package node

import (
	"context"
	"errors"
	"net/http"
	"time"
)

// CatalogReady reports whether this node's catalog may answer reads: it has
// applied what the raft leader had applied when this node first asked
// (package catchup). When not, reason says what it waits for.
func (n *Node) CatalogReady() (ok bool, reason string) { return n.catchup.Ready() }

// catchupSource is what the catch-up gate asks: the leader's applied index.
type catchupSource struct{ n *Node }

func (s catchupSource) AppliedIndex() uint64 { return s.n.cat.LogApplied() }

// LocalTarget: every entry in a leader's log is committed by its term's
// first commit; applying them all is catching up.
func (s catchupSource) LocalTarget() (uint64, bool) {
	if s.n.cat.IsLeader() {
		return s.n.cat.LastIndex(), true
	}
	return 0, false
}

func (s catchupSource) Target(ctx context.Context) (uint64, error) {
	n := s.n
	if t, ok := s.LocalTarget(); ok {
		return t, nil
	}
	addr := n.LeaderHTTP()
	if addr == "" {
		return 0, errors.New("no raft leader known yet")
	}
	timeout := followerGrace * 5
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, max(0, time.Until(dl)))
	}
	_, applied, err := n.leader.relay(addr, http.MethodGet, "/v1/cluster", nil, nil, timeout)
	if err != nil {
		return 0, err
	}
	if applied == 0 {
		return 0, errors.New("the leader did not say its applied index")
	}
	return applied, nil
}
