package catalog

import "fmt"

// Group is a coordinated-prep group (docs/api.md): J jobs of one
// hyper-parameter search reading one dataset in one seeded order, each
// preparing a share of the batches for all. The catalog holds only the
// group's definition; who has read what lives at the group's owner node.
type Group struct {
	Name      string `msgpack:"name"`
	Dataset   string `msgpack:"dataset"`
	Seed      uint64 `msgpack:"seed"`
	BatchSize int    `msgpack:"batch_size"`
	Jobs      int    `msgpack:"jobs"`
	Window    int    `msgpack:"window"`
	// Samples is what one epoch covers: the dataset's samples for a tar
	// dataset, its items otherwise, fixed when the group is defined so a
	// later change of the dataset cannot change the group's batches.
	Samples int `msgpack:"samples"`
	// Version is the raft index that defined the group (set by the catalog).
	Version uint64 `msgpack:"version"`
}

// Batches is the number of batches per epoch (the last one may be short).
func (g *Group) Batches() int { return (g.Samples + g.BatchSize - 1) / g.BatchSize }

// SameSpec reports whether two definitions ask for the same group.
func (g *Group) SameSpec(o *Group) bool {
	return g.Name == o.Name && g.Dataset == o.Dataset && g.Seed == o.Seed && g.BatchSize == o.BatchSize &&
		g.Jobs == o.Jobs && g.Window == o.Window
}

func (f *fsm) putGroup(index uint64, g *Group) any {
	st := f.st
	if old, ok := st.Groups[g.Name]; ok && old.SameSpec(g) {
		return old
	}
	d, ok := st.Datasets[g.Dataset]
	if !ok {
		return fmt.Errorf("%w: dataset %q", ErrNotFound, g.Dataset)
	}
	ng := *g
	ng.Samples = d.Manifest.Len()
	if s := d.Manifest.Samples(); s > 0 {
		ng.Samples = s
	}
	ng.Version = index
	st.Groups[g.Name] = &ng
	return &ng
}

func (f *fsm) deleteGroup(name string) any {
	if _, ok := f.st.Groups[name]; !ok {
		return fmt.Errorf("%w: group %q", ErrNotFound, name)
	}
	delete(f.st.Groups, name)
	return nil
}

// PutGroup defines or replaces a group (idempotent for the same spec).
// Leader only. Whether jobs are still attached is the caller's to check.
func (c *Catalog) PutGroup(g Group) (*Group, error) {
	res, err := c.apply(&command{Op: opPutGroup, Name: g.Name, Group: &g})
	if err != nil {
		return nil, err
	}
	return res.(*Group), nil
}

// DeleteGroup ends a group. Leader only.
func (c *Catalog) DeleteGroup(name string) error {
	_, err := c.apply(&command{Op: opDeleteGroup, Name: name})
	return err
}

// Group returns a group from the local replica.
func (c *Catalog) Group(name string) (*Group, bool) {
	c.fsm.mu.RLock()
	defer c.fsm.mu.RUnlock()
	g, ok := c.fsm.st.Groups[name]
	return g, ok
}

// Groups lists groups by name.
func (c *Catalog) Groups() []*Group {
	c.fsm.mu.RLock()
	defer c.fsm.mu.RUnlock()
	return byName(c.fsm.st.Groups)
}
