package node

import (
	"fmt"

	"stallfree/catalog"
	"stallfree/store"
)

// newStore makes the item store: shared with loaders on this host when
// cfg.ShareItems asks for it and the host allows it, else anonymous.
func newStore(cfg Config, pol store.Policy) (*store.Store, error) {
	if cfg.ShareItems {
		st, err := store.NewShared(cfg.Memory, pol)
		if err == nil {
			return st, nil
		}
		cfg.Logger.Warn("the item store could not be shared with loaders on this host; loaders read items over the socket", "err", err)
	}
	return store.New(cfg.Memory, pol)
}

// Located is where a batch's items lie in this node's shared arena, for a
// loader on this host to copy them from (store.Locate): the files to map
// and, per item in request order, its key and place (Found false: not
// resident here; the loader reads it through a batch request).
type Located struct {
	Arena, Gens string
	Size        uint64
	Items       []LocatedItem
}

// LocatedItem is one item of a Located batch.
type LocatedItem struct {
	Key   string
	Found bool
	store.Location
}

// LocateMany locates the items of a batch resident in this node's shared
// arena, counting each found one as a local hit and advancing job's
// read-ahead as GetManyFor does. ok is false when the arena is not shared.
func (n *Node) LocateMany(d *catalog.Dataset, indices []int, job string) (Located, bool, error) {
	if err := CheckIndices(d, indices); err != nil {
		return Located{}, false, err
	}
	arena, gens, size, ok := n.store.SharedFiles()
	if !ok {
		return Located{}, false, nil
	}
	out := Located{Arena: arena, Gens: gens, Size: size, Items: make([]LocatedItem, len(indices))}
	for j, i := range indices {
		loc, found := n.store.Locate(store.MakeKey(d.ID, uint32(i)))
		n.foresight.Observe(d.ID, i, job) // after the lookup: see clairvoyant.Observe
		if found {
			n.counters.hitsLocal.Add(1)
			n.counters.bytesServed.Add(loc.Size)
		}
		out.Items[j] = LocatedItem{Key: d.Manifest.Key(i), Found: found, Location: loc}
	}
	return out, true, nil
}

// CheckIndices refuses a batch of more than MaxBatch items or with an index
// outside d.
func CheckIndices(d *catalog.Dataset, indices []int) error {
	if len(indices) > MaxBatch {
		return fmt.Errorf("%w: %d items in one batch; the limit is %d", ErrTooLarge, len(indices), MaxBatch)
	}
	for _, i := range indices {
		if i < 0 || i >= d.Manifest.Len() {
			return fmt.Errorf("%w: index %d out of range [0,%d)", ErrBadRequest, i, d.Manifest.Len())
		}
	}
	return nil
}
