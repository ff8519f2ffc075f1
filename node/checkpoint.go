package node

import (
	"slices"

	"stallfree/catalog"
)

// The checkpoint service (package checkpoint) sees the node through these:
// the catalog its commits go through, and the members its pairs are formed
// over.

// MemberView is the cluster as the checkpoint service sees it
// (checkpoint.Members): a view, so the node's own method set stays the item
// path's.
func (n *Node) MemberView() MemberView { return MemberView{n} }

// MemberView answers for the node it was taken from.
type MemberView struct{ n *Node }

// Members are the live members, sorted by name, this node included.
func (v MemberView) Members() []string {
	m := slices.Clone(v.n.peers.Members())
	if !slices.Contains(m, v.n.cfg.Name) {
		m = append(m, v.n.cfg.Name)
	}
	slices.Sort(m)
	return m
}

// MemberHTTP is a member's HTTP address, this node's included.
func (v MemberView) MemberHTTP(name string) (string, bool) {
	if name == v.n.cfg.Name {
		return v.n.cfg.HTTPAdvert, true
	}
	return v.n.peers.HTTPAddr(name)
}

// Catalog is the node's raft catalog, which checkpoint commits go through.
func (v MemberView) Catalog() *catalog.Catalog { return v.n.cat }

// LeaderHTTP is the raft leader's HTTP address, "" when unknown.
func (v MemberView) LeaderHTTP() string { return v.n.ctl.LeaderHTTP() }
