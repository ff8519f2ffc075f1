package node

import (
	"context"
	"time"

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
func (h derivedHost) IsLeader() bool                        { return h.n.cat.IsLeader() }
func (h derivedHost) Forward(ctx context.Context, method, path string, body, out any, timeout time.Duration) (int, error) {
	return h.n.forward(ctx, method, path, body, out, timeout)
}
