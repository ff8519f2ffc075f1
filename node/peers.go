package node

import (
	"context"
	"fmt"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/cluster"
	"stallfree/locality"
	"stallfree/partition"
)

// Peers is how a node reaches the rest of its cluster (groupcache's
// PeerPicker). *cluster.Cluster is the real one; noPeers serves a node that
// runs alone and owns everything.
type Peers interface {
	// Owner is the member owning item index of d, and whether it is this node.
	Owner(d *catalog.Dataset, index int) (owner string, self bool)
	// FromOwner fetches an item from its owner; false means read storage.
	FromOwner(ctx context.Context, owner string, d *catalog.Dataset, index int) (cluster.Fill, bool)
	// Handoff takes an item this node now owns from its previous owner's
	// memory and keeps it; false means read storage.
	Handoff(ctx context.Context, d *catalog.Dataset, index int) (cluster.Fill, bool)
	// PushToOwner hands items this node read to their owner; kept[j] tells
	// whether the owner keeps indices[j].
	PushToOwner(ctx context.Context, owner string, d *catalog.Dataset, indices []int, data [][]byte) (kept []bool, err error)
	// FromOwners fetches items other members own, one request per owner.
	FromOwners(ctx context.Context, d *catalog.Dataset, indices []int) ([]cluster.Fill, []bool)
	// Joined reports whether this node has found its cluster.
	Joined() bool
	// Members are the live members an epoch is pinned to.
	Members() []string
	// Ring is the ring Owner answers from (empty: this node owns everything).
	Ring() *partition.Ring
	// HTTPAddr is a member's HTTP address.
	HTTPAddr(member string) (string, bool)
	// Describe lists every known member, with self as given.
	Describe(self api.Member) []api.Member
	Stats() cluster.Stats
	// Leave takes this node out of gossip and raft's voters before a clean
	// stop (cluster.Leave says how).
	Leave(ctx context.Context) error
	Close()
}

type noPeers struct {
	self string
	ring *partition.Ring // empty: this node owns everything
}

func (p noPeers) Owner(*catalog.Dataset, int) (string, bool) { return p.self, true }
func (noPeers) FromOwner(context.Context, string, *catalog.Dataset, int) (cluster.Fill, bool) {
	return cluster.Fill{}, false
}
func (noPeers) Handoff(context.Context, *catalog.Dataset, int) (cluster.Fill, bool) {
	return cluster.Fill{}, false
}
func (noPeers) PushToOwner(_ context.Context, owner string, _ *catalog.Dataset, _ []int, _ [][]byte) ([]bool, error) {
	return nil, fmt.Errorf("push to %s: this node runs alone", owner)
}
func (noPeers) FromOwners(_ context.Context, _ *catalog.Dataset, indices []int) ([]cluster.Fill, []bool) {
	return make([]cluster.Fill, len(indices)), make([]bool, len(indices))
}
func (noPeers) Joined() bool                          { return true }
func (p noPeers) Members() []string                   { return []string{p.self} }
func (p noPeers) Ring() *partition.Ring               { return p.ring }
func (noPeers) HTTPAddr(string) (string, bool)        { return "", false }
func (noPeers) Describe(self api.Member) []api.Member { return []api.Member{self} }
func (noPeers) Stats() cluster.Stats                  { return cluster.Stats{} }
func (noPeers) Leave(context.Context) error           { return nil }
func (noPeers) Close()                                {}

func newNoPeers(self string) noPeers {
	empty, _ := partition.New(nil) // cannot fail: no members
	return noPeers{self: self, ring: empty}
}

// members is the cluster as control sees it: whatever n.peers is when asked
// (a lone node's, or the cluster's once it is built).
type members struct{ n *Node }

func (m members) Members() []string                     { return m.n.peers.Members() }
func (m members) HTTPAddr(member string) (string, bool) { return m.n.peers.HTTPAddr(member) }

// forPeers is the node as the cluster sees it (cluster.Local).
type forPeers struct{ n *Node }

func (p forPeers) FillForPeer(ctx context.Context, d *catalog.Dataset, index int) (cluster.Fill, error) {
	f, err := p.n.fetchForPeer(ctx, d, index)
	return cluster.Fill{Data: f.data, Sum: f.sum, Recycle: f.recycle}, err
}

func (p forPeers) Observe(dataset uint32, index int) { p.n.foresight.Observe(dataset, index, "") }

// foresight is what a cache policy that knows the jobs' future needs to
// hear: every request, and every catalog change. MinIO and LRU need neither.
type foresight interface {
	Observe(dataset uint32, index int, job string)
	Refresh()
	Wait()
}

type noForesight struct{}

func (noForesight) Observe(uint32, int, string) {}
func (noForesight) Refresh()                    {}
func (noForesight) Wait()                       {}

// clairvoyantHost is the node as the clairvoyant policy sees it.
type clairvoyantHost struct{ n *Node }

func (h clairvoyantHost) Jobs() []*catalog.Job { return h.n.cat.Jobs() }
func (h clairvoyantHost) LatestEpoch(job string) (uint64, bool) {
	return h.n.cat.LatestEpoch(job)
}
func (h clairvoyantHost) EpochMembers(job string, epoch uint64) ([]string, bool) {
	return h.n.cat.EpochMembers(job, epoch)
}
func (h clairvoyantHost) Plan(job string, epoch uint64) (*locality.EpochPlan, error) {
	return h.n.ctl.ReadingPlan(job, epoch)
}
func (h clairvoyantHost) PredictPlan(job string, epoch uint64) (*locality.EpochPlan, []string, error) {
	return h.n.ctl.PredictPlan(job, epoch)
}
func (h clairvoyantHost) Owns(d *catalog.Dataset, index int) bool {
	_, self := h.n.peers.Owner(d, index)
	return self
}
func (h clairvoyantHost) Fill(ctx context.Context, d *catalog.Dataset, index int) error {
	f, err := h.n.fetch(ctx, d, index)
	f.done()
	return err
}
