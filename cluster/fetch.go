package cluster

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"stallfree/catalog"
	"stallfree/membership"
	"stallfree/partition"
	"stallfree/store"
	"stallfree/transport"
)

func (c *Cluster) peerAddr(name string) (string, bool) {
	m, ok := c.ml.Get(name)
	// A member gossip declared dead is still asked while it is on the ring:
	// the voucher keeps it there until it fails to answer, and until the
	// ring is rebuilt its items are nowhere else. Refusing it meanwhile
	// turned every fetch of its items into a storage read.
	usable := m.State == membership.Alive || (m.State == membership.Dead && c.onRing(name))
	if !ok || m.Meta.Peer == "" || !usable {
		return "", false
	}
	return m.Meta.Peer, true
}

// onRing reports whether name is on the ring owners are computed on now.
func (c *Cluster) onRing(name string) bool {
	_, found := slices.BinarySearch(c.ring().Members(), name)
	return found
}

// FromOwner fetches an item from its owner's memory (the owner fills it from
// storage once if needed). ok=false means fall back to storage.
func (c *Cluster) FromOwner(ctx context.Context, owner string, d *catalog.Dataset, index int) (Fill, bool) {
	addr, ok := c.peerAddr(owner)
	if !ok {
		c.peerFailures.Add(1)
		return Fill{}, false
	}
	// The owner may itself read storage, so allow it that time on top of the
	// bound for a hung peer.
	pctx, cancel := context.WithTimeout(ctx, c.cfg.PeerTimeout)
	defer cancel()
	res, err := c.client.Get(pctx, addr, &transport.Request{Dataset: d.Name, DatasetVersion: d.Version,
		Indices: []uint32{uint32(index)}, Ring: c.ring().Version()})
	if err != nil || !res[0].Found {
		if err != nil { // not found without an error: a derived item nobody wrote
			c.peerFailures.Add(1)
			c.log.Debug("peer fetch failed; reading storage", "owner", owner, "err", err)
		}
		return Fill{}, false
	}
	c.peerBytesIn.Add(uint64(len(res[0].Data)))
	return Fill{Data: res[0].Data, Sum: res[0].Sum, Recycle: res[0].Recycle}, true
}

// Handoff asks the item's previous owner for it after a ring change, so that
// ownership moves do not turn into storage reads, and keeps it here. It never
// reads storage.
func (c *Cluster) Handoff(ctx context.Context, d *catalog.Dataset, index int) (Fill, bool) {
	rp := c.rings.Load()
	key := d.Manifest.Key(index)
	tried := map[string]bool{c.cfg.Name: true}
	for _, r := range []*partition.Ring{rp.withoutSelf, rp.prev} {
		if r == nil || r.Empty() {
			continue
		}
		prev := r.Owner(d.RingName(), key)
		if tried[prev] {
			continue
		}
		tried[prev] = true
		if f, ok := c.handoffFrom(ctx, prev, rp.cur.Version(), d, index); ok {
			return f, true
		}
	}
	return Fill{}, false
}

func (c *Cluster) handoffFrom(ctx context.Context, prev string, ring uint64, d *catalog.Dataset, index int) (Fill, bool) {
	addr, ok := c.peerAddr(prev)
	if !ok {
		return Fill{}, false
	}
	pctx, cancel := context.WithTimeout(ctx, c.cfg.PeerTimeout)
	defer cancel()
	res, err := c.client.Get(pctx, addr, &transport.Request{Dataset: d.Name, DatasetVersion: d.Version,
		Indices: []uint32{uint32(index)}, Ring: ring, Handoff: true})
	if err != nil || !res[0].Found {
		return Fill{}, false
	}
	k := store.MakeKey(d.ID, uint32(index))
	if err := c.store.Put(k, res[0].Data, res[0].Sum); err != nil && !errors.Is(err, store.ErrNotAdmitted) {
		return Fill{}, false
	}
	c.peerBytesIn.Add(uint64(len(res[0].Data)))
	return Fill{Data: res[0].Data, Sum: res[0].Sum, Recycle: res[0].Recycle}, true
}

// FromOwners fetches items of d that other members own, one transport
// request per owner, in parallel. got[j] is the item of indices[j] when
// found[j]; the rest the caller reads itself.
func (c *Cluster) FromOwners(ctx context.Context, d *catalog.Dataset, indices []int) (got []Fill, found []bool) {
	got, found = make([]Fill, len(indices)), make([]bool, len(indices))
	byOwner := map[string][]int{}
	for j, i := range indices {
		if owner, self := c.Owner(d, i); !self {
			byOwner[owner] = append(byOwner[owner], j)
		}
	}
	var wg sync.WaitGroup
	for owner, pos := range byOwner {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.batchFromOwner(ctx, owner, d, indices, pos, got, found)
		}()
	}
	wg.Wait()
	return got, found
}

// batchFromOwner fills the positions pos of got and found; each goroutine
// writes only its own positions.
func (c *Cluster) batchFromOwner(ctx context.Context, owner string, d *catalog.Dataset, indices, pos []int, got []Fill, found []bool) {
	addr, ok := c.peerAddr(owner)
	if !ok {
		return
	}
	req := &transport.Request{Dataset: d.Name, DatasetVersion: d.Version, Ring: c.ring().Version()}
	for _, j := range pos {
		req.Indices = append(req.Indices, uint32(indices[j]))
	}
	pctx, cancel := context.WithTimeout(ctx, c.cfg.PeerTimeout+time.Duration(len(pos))*50*time.Millisecond)
	defer cancel()
	res, err := c.client.Get(pctx, addr, req)
	if err != nil {
		c.peerFailures.Add(1)
		return
	}
	for x, j := range pos {
		if res[x].Found {
			c.peerBytesIn.Add(uint64(len(res[x].Data)))
			got[j], found[j] = Fill{Data: res[x].Data, Sum: res[x].Sum}, true
		}
	}
}
