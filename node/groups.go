package node

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/catalog"
)

// The node's part in coordinated prep (package groups holds the rules): the
// catalog's group entries, written through the raft leader like every
// catalog write, the group's owner on the ring, and the memory budget its
// staged batches are charged to.

// groupRingKey is the namespace group names are hashed in on the ring; the
// NUL keeps it apart from every dataset name.
const groupRingKey = "\x00groups"

// Group returns a group from the local catalog replica.
func (n *Node) Group(name string) (*catalog.Group, bool) { return n.cat.Group(name) }

// Groups lists the groups in the local catalog replica.
func (n *Node) Groups() []*catalog.Group { return n.cat.Groups() }

// PutGroup defines a group through the raft leader and waits until this
// node's catalog holds the leader's answer; created is false when the group
// was defined so already.
func (n *Node) PutGroup(ctx context.Context, g catalog.Group) (_ *catalog.Group, created bool, _ error) {
	if n.cat.IsLeader() {
		old, had := n.cat.Group(g.Name)
		got, err := n.cat.PutGroup(g)
		if err != nil {
			return nil, false, err
		}
		return got, !had || old.Version != got.Version, nil
	}
	w := g.Window
	body := api.GroupSpec{Dataset: g.Dataset, Seed: g.Seed, BatchSize: g.BatchSize, Jobs: g.Jobs, Window: &w}
	code, err := n.forward(ctx, fasthttp.MethodPut, "/v1/groups/"+url.PathEscape(g.Name), body, nil, 30*time.Second)
	if err != nil {
		return nil, false, err
	}
	got, ok := n.cat.Group(g.Name)
	if !ok || !got.SameSpec(&g) {
		return nil, false, &api.Error{Status: fasthttp.StatusServiceUnavailable, Message: fmt.Sprintf("group %q: the leader's write has not reached this node yet; retry", g.Name)}
	}
	return got, code == fasthttp.StatusCreated, nil
}

// DeleteGroup ends a group through the raft leader.
func (n *Node) DeleteGroup(ctx context.Context, name string) error {
	if n.cat.IsLeader() {
		return n.cat.DeleteGroup(name)
	}
	_, err := n.forward(ctx, fasthttp.MethodDelete, "/v1/groups/"+url.PathEscape(name), nil, nil, 30*time.Second)
	return err
}

// GroupOwner is the member that stages a group's batches: its HTTP address,
// and whether it is this node.
func (n *Node) GroupOwner(group string) (addr string, self bool) {
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

// ClaimMemory charges n bytes held outside the item store against --memory.
func (n *Node) ClaimMemory(b uint64) bool { return n.store.Claim(b) }

// UnclaimMemory gives back bytes of an earlier ClaimMemory.
func (n *Node) UnclaimMemory(b uint64) { n.store.Unclaim(b) }

// AwaitCatalog waits until cond holds on this node's catalog, or the
// catalog has applied everything this node knows the leader committed (so a
// cond still false is false cluster-wide), or ctx ends; it reports whether
// cond holds.
func (n *Node) AwaitCatalog(ctx context.Context, cond func() bool) bool {
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

// AwaitApplied waits until this node's catalog has applied raft index idx
// (what another node had applied when it relayed a request here), or ctx
// ends.
func (n *Node) AwaitApplied(ctx context.Context, idx uint64) bool {
	return n.cat.WaitFor(ctx, func() bool { return n.cat.AppliedIndex() >= idx })
}
