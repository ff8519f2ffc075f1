package catalog

import (
	"cmp"
	"fmt"
	"slices"
)

// Checkpoints in peer memory (docs/api.md): the catalog holds which steps
// of a checkpoint are committed, their parts (size, sha256, which members
// hold a copy) and whether a step is persisted. The bytes never pass
// through raft; the checkpoint package moves them between nodes.

// CheckpointPart is one committed part.
type CheckpointPart struct {
	Name    string   `msgpack:"name"`
	Size    int64    `msgpack:"size"`
	Sum     string   `msgpack:"sum"` // sha256, 64 lowercase hex digits
	Holders []string `msgpack:"holders"`
}

// CheckpointStep is one committed step. Published steps are never mutated:
// a change (persisted, holders) replaces the step.
type CheckpointStep struct {
	Step      uint64           `msgpack:"step"`
	Parts     []CheckpointPart `msgpack:"parts"`
	Meta      string           `msgpack:"meta,omitempty"` // the commit's "meta", raw JSON
	Persisted bool             `msgpack:"persisted,omitempty"`
	Version   uint64           `msgpack:"version"` // raft index of the commit
}

// Bytes is the step's size, all parts together.
func (s *CheckpointStep) Bytes() int64 {
	var n int64
	for _, p := range s.Parts {
		n += p.Size
	}
	return n
}

// Part finds a part by name.
func (s *CheckpointStep) Part(name string) (CheckpointPart, bool) {
	for _, p := range s.Parts {
		if p.Name == name {
			return p, true
		}
	}
	return CheckpointPart{}, false
}

// Checkpoint is a named series of committed steps, oldest first. Immutable
// once published.
type Checkpoint struct {
	Name  string            `msgpack:"name"`
	Steps []*CheckpointStep `msgpack:"steps"`
}

// Latest is the newest committed step (nil when none).
func (c *Checkpoint) Latest() *CheckpointStep {
	if c == nil || len(c.Steps) == 0 {
		return nil
	}
	return c.Steps[len(c.Steps)-1]
}

// Step finds a committed step.
func (c *Checkpoint) Step(step uint64) (*CheckpointStep, bool) {
	if c == nil {
		return nil, false
	}
	for _, s := range c.Steps {
		if s.Step == step {
			return s, true
		}
	}
	return nil, false
}

type ckptOp uint8

const (
	ckptCommit ckptOp = iota + 1
	ckptPersisted
	ckptHolders
	ckptDelete
)

// checkpointCmd is the payload of opCheckpoint.
type checkpointCmd struct {
	Op    ckptOp           `msgpack:"op"`
	Name  string           `msgpack:"name"`
	Step  uint64           `msgpack:"step,omitempty"`
	Parts []CheckpointPart `msgpack:"parts,omitempty"`
	Meta  string           `msgpack:"meta,omitempty"`
	// Keep is the committing leader's --checkpoint-keep, carried in the
	// command so every member drops the same steps.
	Keep int `msgpack:"keep,omitempty"`
	// Version, on a persisted mark, is the commit the persisted bytes are of
	// (0, in entries from before it: any): a step deleted and committed
	// again under its number is another step.
	Version uint64 `msgpack:"version,omitempty"`
}

func (st *state) applyCheckpoint(index uint64, c *checkpointCmd) any {
	if c == nil {
		return fmt.Errorf("catalog: checkpoint command without a body")
	}
	if st.Checkpoints == nil {
		st.Checkpoints = map[string]*Checkpoint{}
	}
	old := st.Checkpoints[c.Name]
	switch c.Op {
	case ckptCommit:
		if s, ok := old.Step(c.Step); ok {
			if samePartSet(s.Parts, c.Parts) {
				return s // a retried commit
			}
			return fmt.Errorf("%w: checkpoint %s step %d is committed with other parts", ErrConflict, c.Name, c.Step)
		}
		if l := old.Latest(); l != nil && l.Step > c.Step {
			return fmt.Errorf("%w: checkpoint %s has a newer committed step %d", ErrConflict, c.Name, l.Step)
		}
		if len(c.Parts) == 0 {
			return fmt.Errorf("catalog: checkpoint commit without parts")
		}
		parts := slices.Clone(c.Parts)
		slices.SortFunc(parts, func(a, b CheckpointPart) int { return cmp.Compare(a.Name, b.Name) })
		s := &CheckpointStep{Step: c.Step, Parts: parts, Meta: c.Meta, Version: index}
		nc := &Checkpoint{Name: c.Name}
		if old != nil {
			nc.Steps = slices.Clone(old.Steps)
		}
		nc.Steps = append(nc.Steps, s)
		// The newest step is the one just committed, so dropping the oldest
		// beyond keep never drops the newest committed step.
		if keep := max(c.Keep, 1); len(nc.Steps) > keep {
			nc.Steps = slices.Clone(nc.Steps[len(nc.Steps)-keep:])
		}
		st.Checkpoints[c.Name] = nc
		return s
	case ckptPersisted, ckptHolders:
		s, ok := old.Step(c.Step)
		if !ok {
			return fmt.Errorf("%w: checkpoint %s step %d", ErrNotFound, c.Name, c.Step)
		}
		ns := *s
		if c.Op == ckptPersisted {
			if c.Version != 0 && c.Version != s.Version {
				return fmt.Errorf("%w: checkpoint %s step %d is commit %d now, not %d: the persisted bytes are another's",
					ErrConflict, c.Name, c.Step, s.Version, c.Version)
			}
			ns.Persisted = true
		} else {
			ns.Parts = slices.Clone(s.Parts)
			for _, p := range c.Parts {
				for i := range ns.Parts {
					if ns.Parts[i].Name == p.Name && ns.Parts[i].Sum == p.Sum {
						ns.Parts[i].Holders = slices.Clone(p.Holders)
					}
				}
			}
		}
		nc := &Checkpoint{Name: c.Name, Steps: slices.Clone(old.Steps)}
		for i := range nc.Steps {
			if nc.Steps[i].Step == c.Step {
				nc.Steps[i] = &ns
			}
		}
		st.Checkpoints[c.Name] = nc
		return &ns
	case ckptDelete:
		if old == nil {
			return fmt.Errorf("%w: checkpoint %q", ErrNotFound, c.Name)
		}
		delete(st.Checkpoints, c.Name)
		return nil
	}
	return fmt.Errorf("catalog: unknown checkpoint op %d", c.Op)
}

func samePartSet(a, b []CheckpointPart) bool {
	if len(a) != len(b) {
		return false
	}
	for _, p := range b {
		i := slices.IndexFunc(a, func(q CheckpointPart) bool { return q.Name == p.Name })
		if i < 0 || a[i].Sum != p.Sum || a[i].Size != p.Size {
			return false
		}
	}
	return true
}

// CommitCheckpoint commits a step whose parts are held as given; keep bounds
// the committed steps kept for the name. Must run on the leader.
func (c *Catalog) CommitCheckpoint(name string, step uint64, parts []CheckpointPart, meta string, keep int) (*CheckpointStep, error) {
	res, err := c.apply(&command{Op: opCheckpoint, Checkpoint: &checkpointCmd{Op: ckptCommit, Name: name, Step: step,
		Parts: parts, Meta: meta, Keep: keep}})
	if err != nil {
		return nil, err
	}
	return res.(*CheckpointStep), nil
}

// MarkCheckpointPersisted records that a step's parts, as committed at
// version (the commit's raft index), are all in the persistent store;
// ErrConflict when the step under that number is another commit now (it was
// deleted and committed again while its predecessor was being persisted).
func (c *Catalog) MarkCheckpointPersisted(name string, step, version uint64) error {
	_, err := c.apply(&command{Op: opCheckpoint, Checkpoint: &checkpointCmd{Op: ckptPersisted, Name: name, Step: step, Version: version}})
	return err
}

// SetCheckpointHolders records who holds copies of the given parts now
// (after re-replication).
func (c *Catalog) SetCheckpointHolders(name string, step uint64, parts []CheckpointPart) error {
	_, err := c.apply(&command{Op: opCheckpoint, Checkpoint: &checkpointCmd{Op: ckptHolders, Name: name, Step: step, Parts: parts}})
	return err
}

// DeleteCheckpoint drops a checkpoint and all its steps.
func (c *Catalog) DeleteCheckpoint(name string) error {
	_, err := c.apply(&command{Op: opCheckpoint, Checkpoint: &checkpointCmd{Op: ckptDelete, Name: name}})
	return err
}

// Checkpoint returns a checkpoint's committed steps from this member's
// catalog (no quorum needed).
func (c *Catalog) Checkpoint(name string) (*Checkpoint, bool) {
	c.fsm.mu.RLock()
	defer c.fsm.mu.RUnlock()
	ck, ok := c.fsm.st.Checkpoints[name]
	return ck, ok
}

// Checkpoints lists every checkpoint, by name.
func (c *Catalog) Checkpoints() []*Checkpoint {
	c.fsm.mu.RLock()
	defer c.fsm.mu.RUnlock()
	return byName(c.fsm.st.Checkpoints)
}
