package node

import (
	"stallfree/api"

	"context"
	"errors"
	"sync"
	"sync/atomic"

	"stallfree/catalog"
	"stallfree/source"
	"stallfree/store"
)

// warmConcurrency overlaps storage latency without starving loaders.
const warmConcurrency = 8

type warmup struct {
	version uint64
	done    atomic.Int64
	total   int64
	bytes   atomic.Int64
	running atomic.Bool
	full    atomic.Bool
	mu      sync.Mutex
	err     string
}

func (w *warmup) progress() api.Progress {
	w.mu.Lock()
	defer w.mu.Unlock()
	return api.Progress{Done: w.done.Load(), Total: w.total, Bytes: w.bytes.Load(), Running: w.running.Load(), Full: w.full.Load(), Error: w.err}
}

// StartWarmup loads every item of d into the cache in the background (the
// items this node owns; for a tar dataset, the shards it reads, whose
// samples go to their owners); a call while one runs returns its progress. When the store stops admitting (MinIO
// full), warming stops: reading the rest would only cost storage bandwidth.
func (n *Node) StartWarmup(d *catalog.Dataset) api.Progress {
	n.mu.Lock()
	w, ok := n.warmups[d.Name]
	if ok && w.version == d.Version && w.running.Load() {
		n.mu.Unlock()
		return w.progress()
	}
	var owned, shards []int
	w = &warmup{version: d.Version}
	if d.Manifest.IsTar() {
		var items int
		shards, items = n.shardsToRead(d)
		w.total = int64(items)
	} else {
		owned = ownedIndices(n.peers, d)
		w.total = int64(len(owned))
	}
	w.running.Store(true)
	n.warmups[d.Name] = w
	n.mu.Unlock()

	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		defer w.running.Store(false)
		warm := func() error { return n.warm(n.ctx, d, owned, w) }
		if d.Manifest.IsTar() {
			warm = func() error { return n.warmShards(n.ctx, d, shards, w) }
		}
		if err := warm(); err != nil {
			w.mu.Lock()
			w.err = err.Error()
			w.mu.Unlock()
			n.log.Warn("warm-up failed", "dataset", d.Name, "err", err)
		}
	}()
	return w.progress()
}

// WarmupProgress reports the last warm-up of a dataset.
func (n *Node) WarmupProgress(d *catalog.Dataset) api.Progress {
	n.mu.Lock()
	w, ok := n.warmups[d.Name]
	n.mu.Unlock()
	if !ok || w.version != d.Version {
		if d.Manifest.IsTar() {
			_, items := n.shardsToRead(d)
			return api.Progress{Total: int64(items)}
		}
		return api.Progress{Total: int64(len(ownedIndices(n.peers, d)))}
	}
	return w.progress()
}

var errFull = errors.New("store full")

// ownedIndices lists the items this node owns: in a cluster each member warms
// its own share, so warming on every member loads the dataset exactly once.
func ownedIndices(peers Peers, d *catalog.Dataset) []int {
	var out []int
	for i := range d.Manifest.Len() {
		if _, self := peers.Owner(d, i); self {
			out = append(out, i)
		}
	}
	return out
}

func (n *Node) warm(ctx context.Context, d *catalog.Dataset, owned []int, w *warmup) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	next := make(chan int)
	var wg sync.WaitGroup
	errc := make(chan error, warmConcurrency)
	for range warmConcurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := n.warmOne(ctx, d, i, w); err != nil {
					errc <- err
					cancel()
					return
				}
			}
		}()
	}
feed:
	for _, i := range owned {
		select {
		case next <- i:
		case <-ctx.Done():
			break feed
		}
	}
	close(next)
	wg.Wait()
	select {
	case err := <-errc:
		if errors.Is(err, errFull) {
			w.full.Store(true)
			return nil
		}
		return err
	default:
		return ctx.Err()
	}
}

func (n *Node) warmOne(ctx context.Context, d *catalog.Dataset, i int, w *warmup) error {
	k := store.MakeKey(d.ID, uint32(i))
	if !n.store.Contains(k) {
		if _, self := n.peers.Owner(d, i); !self {
			// Membership changed since the warm-up began: the item has
			// another owner now, whose own warm-up or first reader fills it.
			w.done.Add(1)
			return nil
		}
		f, err := n.fetch(ctx, d, i)
		if err != nil {
			return err
		}
		f.done()
		if !n.store.Contains(k) {
			if _, self := n.peers.Owner(d, i); !self {
				w.done.Add(1) // it moved while it was being read
				return nil
			}
			return errFull
		}
		w.bytes.Add(d.Manifest.Size(i))
	} else {
		// Held already: ask the source, cheaply, whether the item is still
		// the registered one (a directory answers with one fstatat; S3 and
		// tar members cannot tell without a request, and are checked when
		// read). A changed item's old bytes are dropped, so they are not
		// served as the item any more, and the warm-up stops naming it.
		if err := n.checkHeld(ctx, d, i, k); err != nil {
			return err
		}
		w.bytes.Add(d.Manifest.Size(i))
	}
	w.done.Add(1)
	return nil
}

// checkHeld drops the held copy of d's item i (key k) when its source item
// changed since registration, and says so (409 source changed).
func (n *Node) checkHeld(ctx context.Context, d *catalog.Dataset, i int, k store.Key) error {
	src, err := n.source(d)
	if err != nil {
		return err
	}
	err = src.Check(ctx, d.Manifest.Entry(i))
	if errors.Is(err, source.ErrChanged) {
		n.store.Delete(k)
		return sourceChanged(d, i, err)
	}
	if err != nil {
		n.log.Debug("warm-up: checking a held item", "dataset", d.Name, "index", i, "err", err)
	}
	return nil
}
