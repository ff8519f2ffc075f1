package node

import (
	"context"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/derived"
)

// Prep is the node's prep cache (derived datasets).
func (n *Node) Prep() *derived.Prep { return n.prep }

// derivedHost is the node as the prep cache sees it.
type derivedHost struct{ n *Node }

func (h derivedHost) Owner(d *catalog.Dataset, index int) (string, bool) {
	return h.n.peers.Owner(d, index)
}
func (h derivedHost) HTTPAddr(member string) (string, bool) { return h.n.peers.HTTPAddr(member) }
func (h derivedHost) Members() []string                     { return h.n.peers.Members() }

// Derive is the catalog write, through the one way to the leader.
func (h derivedHost) Derive(ctx context.Context, name, parent, stage string) (api.Dataset, bool, error) {
	return h.n.ctl.Leader().DeriveDataset(ctx, name, parent, stage)
}
