package node

import (
	"slices"

	"stallfree/catalog"
)

// The checkpoint service (package checkpoint) sees the node through these:
// the catalog its commits go through, and the live members its pairs are
// formed over.

// Catalog is the node's raft catalog.
func (n *Node) Catalog() *catalog.Catalog { return n.cat }

// Members are the live members, sorted by name, this node included.
func (n *Node) Members() []string {
	m := slices.Clone(n.peers.Members())
	if !slices.Contains(m, n.cfg.Name) {
		m = append(m, n.cfg.Name)
	}
	slices.Sort(m)
	return m
}

// MemberHTTP is a member's HTTP address, this node's included.
func (n *Node) MemberHTTP(name string) (string, bool) {
	if name == n.cfg.Name {
		return n.cfg.HTTPAdvert, true
	}
	return n.peers.HTTPAddr(name)
}
