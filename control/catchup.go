package control

import (
	"context"
	"errors"
	"net/http"
	"time"

	"stallfree/catchup"
)

// The catch-up gate (package catchup): catalog reads wait until this node's
// catalog has applied what the raft leader had applied when the node first
// asked, so a restarted node never lists an empty or partial catalog.

// CatalogReady reports whether this node's catalog may answer reads; when
// not, reason says what it waits for.
func (c *Control) CatalogReady() (ok bool, reason string) { return c.gate.Ready() }

// RunCatchup runs the gate until ctx ends (the node runs it).
func (c *Control) RunCatchup(ctx context.Context, interval time.Duration) { c.gate.Run(ctx, interval) }

// catchupSource is what the gate asks: the leader's applied index.
type catchupSource struct{ c *Control }

func (s catchupSource) AppliedIndex() uint64 { return s.c.cat.LogApplied() }

// HasApplied asks the catalog, which knows whether its FSM has applied the
// entry, not only raft's count (catalog.HasApplied).
func (s catchupSource) HasApplied(index uint64) bool { return s.c.cat.HasApplied(index) }

// LocalTarget: every entry in a leader's log is committed by its term's
// first commit; applying them all is catching up.
func (s catchupSource) LocalTarget() (uint64, bool) {
	if s.c.cat.IsLeader() {
		return s.c.cat.LastIndex(), true
	}
	return 0, false
}

func (s catchupSource) Target(ctx context.Context) (uint64, error) {
	c := s.c
	if t, ok := s.LocalTarget(); ok {
		return t, nil
	}
	addr := c.LeaderHTTP()
	if addr == "" {
		return 0, errors.New("no raft leader known yet")
	}
	timeout := followerGrace * 5
	if dl, ok := ctx.Deadline(); ok {
		timeout = min(timeout, max(0, time.Until(dl)))
	}
	// The leader's GET /v1/cluster carries its applied index (markApplied).
	_, applied, err := writeTo(c.client, addr, http.MethodGet, "/v1/cluster", nil, nil, timeout)
	if err != nil {
		return 0, err
	}
	if applied == 0 {
		return 0, errors.New("the leader did not say its applied index")
	}
	return applied, nil
}

var _ catchup.Source = catchupSource{}
