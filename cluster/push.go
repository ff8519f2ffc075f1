package cluster

import (
	"context"
	"errors"
	"fmt"

	"stallfree/catalog"
	"stallfree/store"
	"stallfree/transport"
)

// PushToOwner hands items of d that this node read from storage (a tar
// shard's warm-up: one sequential pass, each sample sent to its owner) to
// owner. kept[j] tells whether the owner now holds indices[j]; it keeps only
// what it owns under the ring both sides agree on, and only while it has room.
func (c *Cluster) PushToOwner(ctx context.Context, owner string, d *catalog.Dataset, indices []int, data [][]byte) ([]bool, error) {
	addr, ok := c.peerAddr(owner)
	if !ok {
		return nil, fmt.Errorf("push to %s: not a live member", owner)
	}
	req := &transport.Request{Dataset: d.Name, DatasetVersion: d.Version, Ring: c.ring().Version(), Data: data}
	var bytes int
	for j, i := range indices {
		req.Indices = append(req.Indices, uint32(i))
		bytes += len(data[j])
	}
	pctx, cancel := context.WithTimeout(ctx, c.cfg.PeerTimeout)
	defer cancel()
	kept, err := c.client.Push(pctx, addr, req)
	if err != nil {
		c.peerFailures.Add(1)
		return nil, fmt.Errorf("push to %s: %w", owner, err)
	}
	c.peerBytesOut.Add(uint64(bytes))
	return kept, nil
}

// errRingDiffers refuses a push made under another membership: which items
// this node owns depends on it.
var errRingDiffers = errors.New("pushed under another ring")

// servePush keeps the pushed items this node owns. Their bytes were checked
// against their sums by the transport and are checked against the manifest's
// sizes here, so nothing is kept that storage did not hold.
func (c *Cluster) servePush(ctx context.Context, d *catalog.Dataset, req *transport.Request) ([]transport.Item, error) {
	if req.Ring != c.ring().Version() {
		if req.Inline {
			return nil, transport.ErrWouldBlock
		}
		c.awaitRing(ctx, req.Ring)
		if req.Ring != c.ring().Version() {
			return nil, fmt.Errorf("%w: %d there, %d here", errRingDiffers, req.Ring, c.ring().Version())
		}
	}
	for j, i := range req.Indices {
		if int(i) >= d.Manifest.Len() {
			return nil, fmt.Errorf("index %d out of range", i)
		}
		// A derived item's size is whatever its loader wrote.
		if !d.Derived() && int64(len(req.Data[j])) != d.Manifest.Size(int(i)) {
			return nil, fmt.Errorf("item %d: %d bytes pushed, the manifest has %d", i, len(req.Data[j]), d.Manifest.Size(int(i)))
		}
	}
	items := make([]transport.Item, len(req.Indices))
	for j, i := range req.Indices {
		if _, self := c.Owner(d, int(i)); !self {
			continue
		}
		k := store.MakeKey(d.ID, i)
		if c.store.Contains(k) {
			items[j].Found = true
			continue
		}
		if err := c.store.Put(k, req.Data[j], req.Sums[j]); err != nil {
			if errors.Is(err, store.ErrNotAdmitted) {
				continue
			}
			return nil, err
		}
		items[j].Found = c.store.Contains(k)
		c.peerBytesIn.Add(uint64(len(req.Data[j])))
	}
	return items, nil
}
