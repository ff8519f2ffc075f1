package node

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"sync"

	"golang.org/x/sync/errgroup"

	"stallfree/bufpool"
	"stallfree/catalog"
	"stallfree/source"
	"stallfree/store"
)

// A tar dataset warms by shards, not by items: each shard is read front to
// back once in the whole cluster, by the owner of its first sample, which
// keeps its own samples and pushes the others to their owners in batches.
// One sequential pass costs far less than a ranged read per member.
const (
	// shardWarmers is how many shards one node reads at once.
	shardWarmers = 4
	// pushBytes and pushItems bound one push: large enough that the per-push
	// round trip is amortised, small enough to keep every owner busy.
	pushBytes = 4 << 20
	pushItems = 512
	// pendingBytes bounds what one shard's reader holds for all owners
	// together while their batches fill: with many members, each owner's
	// batch is smaller (never under minPushBytes), so memory does not grow
	// with the cluster.
	pendingBytes = 16 << 20
	minPushBytes = 256 << 10
)

// shardsToRead lists the shards this node reads in a warm-up of d, and how
// many items they hold.
func (n *Node) shardsToRead(d *catalog.Dataset) (shards []int, items int) {
	for s := range d.Manifest.Shards {
		first, end := d.Manifest.ShardItems(s)
		if first == end {
			continue
		}
		if _, self := n.peers.Owner(d, first); self {
			shards = append(shards, s)
			items += end - first
		}
	}
	return shards, items
}

// fullOwners are the members that stopped admitting during a warm-up.
type fullOwners struct {
	mu  sync.Mutex
	set map[string]bool
}

func (f *fullOwners) has(m string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.set[m]
}

func (f *fullOwners) add(m string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.set[m] = true
}

func (f *fullOwners) any() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.set) > 0
}

// all reports whether every member is full: reading on is then pointless.
func (f *fullOwners) all(members []string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, m := range members {
		if !f.set[m] {
			return false
		}
	}
	return len(members) > 0
}

func (n *Node) warmShards(ctx context.Context, d *catalog.Dataset, shards []int, w *warmup) error {
	full := &fullOwners{set: map[string]bool{}}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(shardWarmers)
	for _, s := range shards {
		if full.all(n.peers.Members()) {
			break
		}
		g.Go(func() error { return n.warmShard(ctx, d, s, w, full) })
	}
	err := g.Wait()
	if full.any() {
		w.full.Store(true)
	}
	return err
}

// pushBatch gathers one owner's samples of a shard, each in a pooled buffer
// that goes back to the pool once the batch is sent.
type pushBatch struct {
	indices []int
	data    [][]byte
	bufs    []*bufpool.Buf
	bytes   int64
	limit   int64
}

func (b *pushBatch) room(size int64) bool {
	return len(b.indices) == 0 || len(b.indices) < pushItems && b.bytes+size <= b.limit
}

// take reads the next size bytes of r into the batch as item i.
func (b *pushBatch) take(r io.Reader, pool *bufpool.Pool, i int, size int64) error {
	buf := pool.Get(int(size))
	if _, err := io.ReadFull(r, buf.B); err != nil {
		pool.Put(buf)
		return err
	}
	b.indices, b.data, b.bufs = append(b.indices, i), append(b.data, buf.B), append(b.bufs, buf)
	b.bytes += size
	return nil
}

// reset gives the batch's buffers back.
func (b *pushBatch) reset(pool *bufpool.Pool) {
	for _, buf := range b.bufs {
		pool.Put(buf)
	}
	b.indices, b.data, b.bufs, b.bytes = b.indices[:0], b.data[:0], b.bufs[:0], 0
}

// warmShard reads shard s once, front to back. A shard found changed since
// registration (rewritten before or during the pass: each read is checked)
// has this node's held members dropped, as a changed file's held copy is,
// and the warm-up stops naming the member it was at: 409 source changed.
func (n *Node) warmShard(ctx context.Context, d *catalog.Dataset, s int, w *warmup, full *fullOwners) (err error) {
	first, end := d.Manifest.ShardItems(s)
	at := first // the member the pass has reached
	defer func() {
		if errors.Is(err, source.ErrChanged) && first < end {
			for i := first; i < end; i++ {
				n.store.Delete(store.MakeKey(d.ID, uint32(i)))
			}
			err = sourceChanged(d, at, err)
		}
	}()
	src, err := n.source(d)
	if err != nil {
		return err
	}
	shard := d.Manifest.ShardEntry(s)
	r, err := src.Stream(ctx, shard)
	if err != nil {
		return err
	}
	defer r.Close()
	n.counters.sourceReads.Add(1)
	br := bufio.NewReaderSize(r, 256<<10)
	var pos int64
	defer func() { n.counters.sourceBytes.Add(uint64(pos)) }()

	limit := int64(max(minPushBytes, min(pushBytes, pendingBytes/max(len(n.peers.Members()), 1))))
	batches := map[string]*pushBatch{}
	defer func() { // on an early return, the buffers still held
		for _, b := range batches {
			b.reset(&n.bufs)
		}
	}()
	flush := func(owner string) {
		b := batches[owner]
		if b == nil || len(b.indices) == 0 {
			return
		}
		n.pushSamples(ctx, d, owner, b, w, full)
		b.reset(&n.bufs)
	}
	for i := first; i < end; i++ {
		at = i
		off, size := d.Manifest.Offsets[i], d.Manifest.Size(i)
		if off < pos {
			return fmt.Errorf("shard %s: member %d at byte %d overlaps the one before", shard.Key, i, off)
		}
		if _, err := br.Discard(int(off - pos)); err != nil {
			return fmt.Errorf("read %s at byte %d: %w", shard.Key, pos, err)
		}
		pos = off
		owner, self := n.peers.Owner(d, i)
		k := store.MakeKey(d.ID, uint32(i))
		if held := self && n.store.Contains(k); held || full.has(owner) {
			if _, err := br.Discard(int(size)); err != nil {
				return fmt.Errorf("read %s at byte %d: %w", shard.Key, pos, err)
			}
			pos += size
			if held {
				w.bytes.Add(size)
			}
			w.done.Add(1)
			continue
		}
		if self {
			if err := n.keepSample(br, d, i, w, full); err != nil {
				return fmt.Errorf("read %s at byte %d: %w", shard.Key, pos, err)
			}
			pos += size
			continue
		}
		b := batches[owner]
		if b == nil {
			b = &pushBatch{limit: limit}
			batches[owner] = b
		}
		if !b.room(size) {
			flush(owner)
		}
		if err := b.take(br, &n.bufs, i, size); err != nil {
			return fmt.Errorf("read %s at byte %d: %w", shard.Key, pos, err)
		}
		pos += size
	}
	for owner := range batches {
		flush(owner)
	}
	return ctx.Err()
}

// keepSample stores member i, read from r, on this node, its owner.
func (n *Node) keepSample(r io.Reader, d *catalog.Dataset, i int, w *warmup, full *fullOwners) error {
	size := d.Manifest.Size(i)
	buf := n.bufs.Get(int(size))
	defer n.bufs.Put(buf)
	data := buf.B[:size]
	if _, err := io.ReadFull(r, data); err != nil {
		return err
	}
	_, err := n.store.PutSummed(store.MakeKey(d.ID, uint32(i)), data)
	switch {
	case errors.Is(err, store.ErrNotAdmitted):
		full.add(n.cfg.Name)
	case err != nil:
		return err
	default:
		w.bytes.Add(size)
	}
	w.done.Add(1)
	return nil
}

// pushSamples hands a batch to its owner. A push that fails costs nothing
// but the warm-up of those items: their owner reads them when first asked.
func (n *Node) pushSamples(ctx context.Context, d *catalog.Dataset, owner string, b *pushBatch, w *warmup, full *fullOwners) {
	kept, err := n.peers.PushToOwner(ctx, owner, d, b.indices, b.data)
	if err != nil {
		n.log.Warn("warm-up push failed; its owner will read those items itself", "dataset", d.Name, "owner", owner, "items", len(b.indices), "err", err)
	}
	for j, ok := range kept {
		if ok {
			w.bytes.Add(int64(len(b.data[j])))
		} else {
			// The ring is agreed (a push under another is refused), so an
			// item its owner did not keep means the owner is full.
			full.add(owner)
		}
	}
	w.done.Add(int64(len(b.indices)))
}
