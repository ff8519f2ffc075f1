package node

import "stallfree/clusterauth"

// memberKey is the key that proves a request between nodes comes from a
// member (clusterauth.SignRequest): derived from the cluster key, apart from
// the gossip, transport and raft keys. Empty without a cluster key.
func memberKey(clusterKey []byte) []byte { return clusterauth.Derive(clusterKey, "http") }

// MemberKey is the key the internal routes want a member's proof made with
// (nil without a cluster key: those nodes listen on loopback only).
func (n *Node) MemberKey() []byte { return memberKey(n.cfg.ClusterKey) }
