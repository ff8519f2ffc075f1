package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cespare/xxhash/v2"

	"stallfree/catalog"
	"stallfree/store"
	"stallfree/transport"
)

// servePeer answers another node. It never forwards: what this node holds is
// served from memory, anything else is read from storage here (and cached only
// if this node owns it), so no request can bounce between nodes.
func (c *Cluster) servePeer(ctx context.Context, req *transport.Request) (_ []transport.Item, err error) {
	// The asker may have applied a registration this node has not yet: wait a
	// moment for the catalog to catch up rather than fail the fetch.
	d, ok := c.cat.Dataset(req.Dataset)
	if req.Inline && (!ok || d.Version != req.DatasetVersion) {
		return nil, transport.ErrWouldBlock
	}
	if !ok || d.Version != req.DatasetVersion {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		caughtUp := c.cat.WaitFor(wctx, func() bool {
			d, ok = c.cat.Dataset(req.Dataset)
			return ok && d.Version >= req.DatasetVersion
		})
		cancel()
		if !caughtUp {
			return nil, fmt.Errorf("dataset %q at version %d: not here after a second", req.Dataset, req.DatasetVersion)
		}
	}
	if d.Version != req.DatasetVersion { // this node is ahead: the asker's view is stale
		return nil, fmt.Errorf("dataset %s is at version %d here, %d there", d.Name, d.Version, req.DatasetVersion)
	}
	if req.Push {
		return c.servePush(ctx, d, req)
	}
	if req.Handoff && req.Ring != c.ring().Version() {
		// The new owner sees a membership this node has not caught up with.
		// Deciding under the stale ring whether to let the items go could
		// leave them held twice.
		if req.Inline {
			return nil, transport.ErrWouldBlock
		}
		c.awaitRing(ctx, req.Ring)
	}
	// Refused before anything is pinned or filled: a node's fill would index
	// its manifest.
	for _, i := range req.Indices {
		if int(i) >= d.Manifest.Len() {
			return nil, fmt.Errorf("index %d out of range", i)
		}
	}
	items := make([]transport.Item, len(req.Indices))
	// What to undo when the answer fails part-way: the pins and buffers of the
	// items gathered so far (without a handoff's delete, as nothing was sent).
	undo := make([]func(), len(req.Indices))
	defer func() {
		if err != nil {
			for _, f := range undo {
				if f != nil {
					f()
				}
			}
		}
	}()
	if req.Inline {
		// Only when every item is resident; observed once, on the call
		// that answers.
		for j, i := range req.Indices {
			ref, ok := c.store.Get(store.MakeKey(d.ID, i))
			if !ok {
				return nil, transport.ErrWouldBlock
			}
			items[j] = transport.Item{Data: ref.Data, Sum: ref.Sum, Found: true, Release: ref.Release}
			undo[j] = ref.Release
		}
	}
	for j, i := range req.Indices {
		k := store.MakeKey(d.ID, i)
		if !items[j].Found { // not pinned by the inline pass
			if ref, ok := c.store.Get(k); ok {
				items[j] = transport.Item{Data: ref.Data, Sum: ref.Sum, Found: true, Release: ref.Release}
				undo[j] = ref.Release
			}
		}
		if !req.Handoff {
			c.local.Observe(d.ID, int(i)) // after the lookup: see clairvoyant.Observe
		}
		if it := items[j]; it.Found {
			if req.Handoff {
				if _, self := c.Owner(d, int(i)); !self {
					// The asker owns it now: after sending, let it go, so
					// the cluster keeps holding each item once.
					items[j].Release = func() { it.Release(); c.store.Delete(k) }
				}
			}
			c.peerBytesOut.Add(uint64(len(it.Data)))
			continue
		}
		if req.Handoff {
			continue
		}
		f, err := c.local.FillForPeer(ctx, d, int(i))
		if errors.Is(err, catalog.ErrNotWritten) {
			continue // a derived item not written: not held, not a failure
		}
		if err != nil {
			return nil, err
		}
		if xxhash.Sum64(f.Data) != f.Sum {
			return nil, errors.New("checksum mismatch after fill")
		}
		items[j] = transport.Item{Data: f.Data, Sum: f.Sum, Found: true, Release: f.Recycle}
		undo[j] = f.Recycle
		c.peerBytesOut.Add(uint64(len(f.Data)))
	}
	return items, nil
}
