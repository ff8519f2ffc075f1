package node

import (
	"context"
	"time"

	"stallfree/catalog"
)

// The node's part in coordinated prep (package groups holds the rules): the
// catalog's group entries, written through the raft leader like every
// catalog write (control.Leader), the group's owner on the ring, and the
// memory budget its staged batches are charged to.

// groupRingKey is the namespace group names are hashed in on the ring; the
// NUL keeps it apart from every dataset name.
const groupRingKey = "\x00groups"

// GroupHost is the node as the groups service sees it (groups.Host): a view,
// so the node's own method set stays the item path's.
func (n *Node) GroupHost() GroupHost { return GroupHost{n} }

// GroupHost answers for the node it was taken from.
type GroupHost struct{ n *Node }

// Name is the node's name.
func (h GroupHost) Name() string { return h.n.cfg.Name }

// Group returns a group from the local catalog replica.
func (h GroupHost) Group(name string) (*catalog.Group, bool) { return h.n.cat.Group(name) }

// Groups lists the groups in the local catalog replica.
func (h GroupHost) Groups() []*catalog.Group { return h.n.cat.Groups() }

// AppliedIndex is the raft index the local catalog has applied.
func (h GroupHost) AppliedIndex() uint64 { return h.n.cat.AppliedIndex() }

// AwaitApplied waits until the local catalog has applied idx, or ctx ends.
func (h GroupHost) AwaitApplied(ctx context.Context, idx uint64) bool {
	return h.n.cat.WaitFor(ctx, func() bool { return h.n.cat.AppliedIndex() >= idx })
}

// PutGroup defines a group through the raft leader and returns once this
// node's catalog holds the leader's answer; created is false when the group
// was defined so already.
func (h GroupHost) PutGroup(ctx context.Context, g catalog.Group) (*catalog.Group, bool, error) {
	return h.n.ctl.PutGroup(ctx, g)
}

// DeleteGroup ends a group through the raft leader.
func (h GroupHost) DeleteGroup(ctx context.Context, name string) error {
	return h.n.ctl.DeleteGroup(ctx, name)
}

// GroupOwner is the member that stages a group's batches: its HTTP address,
// and whether it is this node.
func (h GroupHost) GroupOwner(group string) (addr string, self bool) {
	n := h.n
	owner := n.peers.Ring().Owner(groupRingKey, group)
	if owner == "" || owner == n.cfg.Name {
		return n.cfg.HTTPAdvert, true
	}
	addr, ok := n.peers.HTTPAddr(owner)
	if !ok {
		return n.cfg.HTTPAdvert, true // an owner nobody can reach: stage here
	}
	return addr, false
}

// ClaimMemory charges b bytes held outside the item store against --memory.
func (h GroupHost) ClaimMemory(b uint64) bool { return h.n.store.Claim(b) }

// UnclaimMemory gives back bytes of an earlier ClaimMemory.
func (h GroupHost) UnclaimMemory(b uint64) { h.n.store.Unclaim(b) }

// AwaitCatalog waits until cond holds on this node's catalog, or the
// catalog has applied everything this node knows the leader committed (so a
// cond still false is false cluster-wide), or ctx ends; it reports whether
// cond holds.
func (h GroupHost) AwaitCatalog(ctx context.Context, cond func() bool) bool {
	n := h.n
	// Polled as well as woken by changes: raft's own entries (no-ops,
	// configuration) move the commit index without a change of the catalog.
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		changed := n.cat.Updated()
		if cond() {
			return true
		}
		if caughtUp, _ := n.cat.CaughtUp(); caughtUp {
			return cond()
		}
		select {
		case <-ctx.Done():
			return cond()
		case <-changed:
		case <-t.C:
		}
	}
}
