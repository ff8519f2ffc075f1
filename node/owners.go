package node

import (
	"encoding/binary"
	"strconv"

	"stallfree/api"
	"stallfree/catalog"
)

// Cluster is GET /v1/cluster: every member this node knows, with each alive
// member's cache figures.
func (n *Node) Cluster() api.Cluster {
	st := n.Stats()
	self := api.Member{Name: n.cfg.Name, HTTP: n.cfg.HTTPAdvert, Peer: n.cfg.PeerAdvert, State: "alive",
		Items: st.ItemsCached, Bytes: st.BytesCached, Capacity: st.CapacityBytes, Share: 1, Socket: n.cfg.Socket}
	info := api.Cluster{Self: n.cfg.Name, Leader: n.cat.Leader(), Members: n.peers.Describe(self)}
	if servers, err := n.cat.Servers(); err == nil {
		role := map[string]string{}
		for _, sv := range servers {
			role[sv.ID] = map[bool]string{true: "voter", false: "nonvoter"}[sv.Voter]
		}
		for i := range info.Members {
			info.Members[i].Raft = role[info.Members[i].Name]
		}
	}
	return info
}

// ownerMap is a dataset's owner table for one ring, kept until the ring
// changes. A dataset ID names one manifest for good (the catalog never gives
// an ID again), so the ID alone keys the dataset's part of it.
type ownerMap struct {
	ring   uint64
	owners api.Owners
}

// RingVersion names the ring owners are computed on now; clients that route
// by owner compare it (the X-Ring header, in hex) with their table's.
func (n *Node) RingVersion() uint64 { return n.peers.Ring().Version() }

func ringID(v uint64) string { return strconv.FormatUint(v, 16) }

// Owners is d's owner table: which member owns each index, so that clients
// can read from the owner directly.
func (n *Node) Owners(d *catalog.Dataset) api.Owners {
	ring := n.peers.Ring()
	n.mu.Lock()
	if m, ok := n.owners[d.ID]; ok && m.ring == ring.Version() {
		n.mu.Unlock()
		return m.owners
	}
	n.mu.Unlock()
	members := ring.Members()
	if ring.Empty() {
		members = []string{n.cfg.Name}
	}
	out := api.Owners{Ring: ringID(ring.Version()), Members: make([]api.OwnerMember, len(members))}
	pos := make(map[string]int, len(members))
	for x, m := range members {
		pos[m] = x
		addr := n.cfg.HTTPAdvert
		if m != n.cfg.Name {
			addr, _ = n.peers.HTTPAddr(m)
		}
		out.Members[x] = api.OwnerMember{Name: m, HTTP: addr}
	}
	width := 1
	if len(members) > 255 {
		width = 2
	}
	out.Owners = make([]byte, width*d.Manifest.Len())
	if !ring.Empty() {
		for i := range d.Manifest.Len() {
			x := pos[ring.Owner(d.RingName(), d.Manifest.OwnerKey(i))]
			if width == 1 {
				out.Owners[i] = byte(x)
			} else {
				binary.LittleEndian.PutUint16(out.Owners[2*i:], uint16(x))
			}
		}
	}
	n.mu.Lock()
	n.owners[d.ID] = ownerMap{ring: ring.Version(), owners: out}
	n.mu.Unlock()
	return out
}
