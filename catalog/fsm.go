package catalog

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/hashicorp/raft"
	"github.com/vmihailenco/msgpack/v5"
)

var (
	// ErrNotFound: no such dataset or job.
	ErrNotFound = errors.New("not found")
	// ErrConflict: the name is taken by something different.
	ErrConflict = errors.New("conflict")
	// ErrNotWritten: an item of a derived dataset that no loader has
	// written yet (or whose copy was evicted or lost with its node). It is
	// never read from storage.
	ErrNotWritten = errors.New("not written")
	// ErrMoved: a refresh listed against a version that is no longer the
	// registered one (another refresh came first); it lists again.
	ErrMoved = errors.New("moved on")
)

// Dataset is an immutable, committed catalog entry.
type Dataset struct {
	ID       uint32    `msgpack:"id"`
	Name     string    `msgpack:"name"`
	Source   string    `msgpack:"source"`
	Version  uint64    `msgpack:"version"` // raft index of the commit
	Manifest *Manifest `msgpack:"manifest"`
	// Quota bounds the bytes the cluster caches of this dataset (nil: no
	// quota); see quota.go.
	Quota *uint64 `msgpack:"quota,omitempty"`
	// DerivedFrom names the parent of a derived dataset (a prep cache):
	// its items are written by loaders, its manifest is the parent's.
	DerivedFrom string `msgpack:"derived_from,omitempty"`
	Stage       string `msgpack:"stage,omitempty"`
}

// Derived reports whether d is a derived dataset, whose items are written by
// loaders and never read from storage.
func (d *Dataset) Derived() bool { return d.DerivedFrom != "" }

// RingName is the name the ring places d's items by: a derived dataset's
// items live where its parent's do, so a locality-aware order of the
// parent is one of the derived dataset too, and the loader that writes item
// i read the parent's item i from the same node.
func (d *Dataset) RingName() string {
	if d.Derived() {
		return d.DerivedFrom
	}
	return d.Name
}

// Job is a registered training job: which dataset, how it is shuffled and
// batched, and which node each rank runs on.
type Job struct {
	Name      string   `msgpack:"name" json:"name"`
	Dataset   string   `msgpack:"dataset" json:"dataset"`
	Seed      uint64   `msgpack:"seed" json:"seed"`
	WorldSize int      `msgpack:"world_size" json:"world_size"`
	BatchSize int      `msgpack:"batch_size" json:"batch_size"`
	Ranks     []string `msgpack:"ranks" json:"ranks"`
	Version   uint64   `msgpack:"version" json:"version"`
	// Prev is the generation this one replaced when only the rank layout
	// changed (world size, ranks): an epoch interrupted under it can resume
	// under this one. Set by the catalog, never by a request.
	Prev *Generation `msgpack:"prev,omitempty" json:"previous,omitempty"`
}

// Generation is a job's rank layout as it was, with the member sets its
// epochs were pinned to: enough to recompute any of its orders.
type Generation struct {
	Version   uint64              `msgpack:"version" json:"generation"`
	WorldSize int                 `msgpack:"world_size" json:"world_size"`
	Ranks     []string            `msgpack:"ranks" json:"ranks"`
	Pins      map[uint64][]string `msgpack:"pins" json:"-"`
}

// AsJob is the job as it was in generation g.
func (j *Job) AsJob(g *Generation) *Job {
	return &Job{Name: j.Name, Dataset: j.Dataset, Seed: j.Seed, WorldSize: g.WorldSize, BatchSize: j.BatchSize,
		Ranks: g.Ranks, Version: g.Version}
}

type opType uint8

const (
	opBegin opType = iota + 1
	opChunk
	opCommit
	opDeleteDataset
	opPutJob
	opDeleteJob
	opPinEpoch
	opCheckpoint // checkpoint.go
	opPutGroup
	opDeleteGroup
	opDerive
)

// keptEpochPins bounds the pinned epochs remembered per job.
const keptEpochPins = 16

type command struct {
	Op     opType    `msgpack:"op"`
	Name   string    `msgpack:"name"`
	Source string    `msgpack:"source,omitempty"`
	Token  string    `msgpack:"token,omitempty"`
	Count  int       `msgpack:"count,omitempty"`
	Chunk  *Manifest `msgpack:"chunk,omitempty"`
	Job    *Job      `msgpack:"job,omitempty"`
	Epoch  uint64    `msgpack:"epoch,omitempty"`
	// Members of a pinned epoch.
	Members []string `msgpack:"members,omitempty"`
	// Quota of opSetQuota (nil lifts it).
	Quota *uint64 `msgpack:"quota,omitempty"`
	// Checkpoint carries opCheckpoint (checkpoint.go).
	Checkpoint *checkpointCmd `msgpack:"checkpoint,omitempty"`
	Group      *Group         `msgpack:"group,omitempty"`
	// Parent and Stage of a derived dataset.
	Parent string `msgpack:"parent,omitempty"`
	Stage  string `msgpack:"stage,omitempty"`
	// Refresh makes an opBegin on a registered dataset of the same source
	// start a new version of it (a fresh listing under a new ID) instead
	// of returning the existing one.
	Refresh bool `msgpack:"refresh,omitempty"`
}

type pending struct {
	ID       uint32    `msgpack:"id"`
	Source   string    `msgpack:"source"`
	Token    string    `msgpack:"token"`
	Count    int       `msgpack:"count"`
	Manifest *Manifest `msgpack:"manifest"`
}

type state struct {
	NextID   uint32              `msgpack:"next_id"`
	Datasets map[string]*Dataset `msgpack:"datasets"`
	Pending  map[string]*pending `msgpack:"pending"`
	Jobs     map[string]*Job     `msgpack:"jobs"`
	// Pins fix, per job and epoch, the member set whose ring the epoch's
	// locality-aware order is computed from, so every node computes the same
	// order even while membership changes.
	Pins map[string]map[uint64][]string `msgpack:"pins"`
	// Checkpoints are the committed checkpoint steps (checkpoint.go).
	Checkpoints map[string]*Checkpoint `msgpack:"checkpoints,omitempty"`
	// Groups are coordinated-prep groups by name (groups.go).
	Groups map[string]*Group `msgpack:"groups"`
}

func newState() *state {
	return &state{NextID: 1, Datasets: map[string]*Dataset{}, Pending: map[string]*pending{}, Jobs: map[string]*Job{},
		Pins: map[string]map[uint64][]string{}, Groups: map[string]*Group{}}
}

// fsm applies catalog commands. Readers take the RLock; committed datasets and
// jobs are never mutated after publication, so they can be handed out freely.
type fsm struct {
	mu       sync.RWMutex
	st       *state
	onChange func()
	// onLarge runs after a large registration is committed or a large
	// catalog restored: what decoding it used is garbage then.
	onLarge func()
	// applied is the index of the last command this FSM has applied, 0
	// before the first since a start or a restore (see Catalog.AppliedIndex).
	applied atomic.Uint64
	// restored is set by a snapshot restore (after which raft's applied
	// index is the snapshot's, and the FSM holds it all) until the next
	// command is applied.
	restored atomic.Bool
}

// beginResult tells the registering node whether to upload a manifest.
type beginResult struct {
	existing *Dataset
}

func (f *fsm) Apply(l *raft.Log) any {
	var c command
	if err := msgpack.Unmarshal(l.Data, &c); err != nil {
		return fmt.Errorf("catalog: decode command: %w", err)
	}
	f.mu.Lock()
	res := f.apply(l.Index, &c)
	f.applied.Store(l.Index)
	f.mu.Unlock()
	if f.onChange != nil {
		f.onChange()
	}
	if d, ok := res.(*Dataset); ok && c.Op == opCommit && d.Manifest.Len() >= largeRegistration && f.onLarge != nil {
		f.onLarge()
	}
	return res
}

// largeRegistration is the size from which a registration's garbage (the
// listing, encoded and decoded chunks: hundreds of bytes an item, against
// the ~20 the manifest keeps) is worth handing back to the OS at once rather
// than leaving it to the collector, which with the node's headroom may not run
// for a long time.
const largeRegistration = 100_000

func (f *fsm) apply(index uint64, c *command) any {
	st := f.st
	switch c.Op {
	case opBegin:
		d, exists := st.Datasets[c.Name]
		if exists && d.Source != c.Source {
			return fmt.Errorf("%w: dataset %q is registered with source %s", ErrConflict, c.Name, d.Source)
		}
		if exists && d.Derived() {
			return fmt.Errorf("%w: %q is derived: loaders write its items, there is no source to list again", ErrConflict, c.Name)
		}
		if exists && !c.Refresh {
			return beginResult{existing: d}
		}
		// A newer registration of the same name supersedes an abandoned one.
		p := &pending{Source: c.Source, Token: c.Token, Count: c.Count, Manifest: &Manifest{}}
		if exists {
			// A refresh is a new version under a new ID: items cached under
			// the old one (old bytes, old indices) can never be taken for it.
			p.ID = st.NextID
			st.NextID++
		} else if old, ok := st.Pending[c.Name]; ok {
			p.ID = old.ID
		} else {
			p.ID = st.NextID
			st.NextID++
		}
		st.Pending[c.Name] = p
		return beginResult{}
	case opChunk:
		p, ok := st.Pending[c.Name]
		if !ok || p.Token != c.Token || c.Chunk == nil {
			return fmt.Errorf("%w: registration of %q was superseded", ErrConflict, c.Name)
		}
		if !c.Chunk.upgrade() || !c.Chunk.wellFormed() {
			return fmt.Errorf("catalog: a malformed manifest chunk for %q", c.Name)
		}
		p.Manifest.appendChunk(c.Chunk)
		return nil
	case opCommit:
		p, ok := st.Pending[c.Name]
		if !ok || p.Token != c.Token {
			return fmt.Errorf("%w: registration of %q was superseded", ErrConflict, c.Name)
		}
		if p.Manifest.Len() != p.Count {
			return fmt.Errorf("catalog: %q manifest has %d of %d entries", c.Name, p.Manifest.Len(), p.Count)
		}
		delete(st.Pending, c.Name)
		p.Manifest.seal()
		d := &Dataset{ID: p.ID, Name: c.Name, Source: p.Source, Version: index, Manifest: p.Manifest}
		if old, ok := st.Datasets[c.Name]; ok { // a refresh replaces the version it began from
			d.Quota = old.Quota
			// Derived datasets are the old version's keys and indices, and
			// their items were computed from its bytes: they go with it, as
			// with a delete, and loaders derive them again.
			for name, dd := range st.Datasets {
				if dd.DerivedFrom == c.Name {
					delete(st.Datasets, name)
				}
			}
		}
		st.Datasets[c.Name] = d
		return d
	case opDeleteDataset:
		if _, ok := st.Datasets[c.Name]; !ok {
			return fmt.Errorf("%w: dataset %q", ErrNotFound, c.Name)
		}
		delete(st.Datasets, c.Name)
		// A derived dataset is the parent's keys and nothing else: it goes
		// with it.
		for name, d := range st.Datasets {
			if d.DerivedFrom == c.Name {
				delete(st.Datasets, name)
			}
		}
		return nil
	case opDerive:
		return st.derive(index, c)
	case opPutJob:
		j := *c.Job
		j.Prev = nil
		old, had := st.Jobs[j.Name]
		if had {
			j.Version = old.Version
			if jobEqual(old, &j) {
				return old
			}
		}
		if _, ok := st.Datasets[j.Dataset]; !ok {
			return fmt.Errorf("%w: dataset %q", ErrNotFound, j.Dataset)
		}
		if had && old.Dataset == j.Dataset && old.Seed == j.Seed && old.BatchSize == j.BatchSize {
			// Only the layout changed: keep the old one to resume from.
			j.Prev = &Generation{Version: old.Version, WorldSize: old.WorldSize, Ranks: old.Ranks, Pins: maps.Clone(st.Pins[j.Name])}
		}
		j.Version = index
		st.Jobs[j.Name] = &j
		delete(st.Pins, j.Name) // a changed job starts with fresh orders
		return &j
	case opDeleteJob:
		if _, ok := st.Jobs[c.Name]; !ok {
			return fmt.Errorf("%w: job %q", ErrNotFound, c.Name)
		}
		delete(st.Jobs, c.Name)
		delete(st.Pins, c.Name)
		return nil
	case opPinEpoch:
		if _, ok := st.Jobs[c.Name]; !ok {
			return fmt.Errorf("%w: job %q", ErrNotFound, c.Name)
		}
		pins := st.Pins[c.Name]
		if pins == nil {
			pins = map[uint64][]string{}
			st.Pins[c.Name] = pins
		}
		if m, ok := pins[c.Epoch]; ok { // first pin wins
			return m
		}
		pins[c.Epoch] = c.Members
		for len(pins) > keptEpochPins {
			oldest := c.Epoch
			for e := range pins {
				oldest = min(oldest, e)
			}
			delete(pins, oldest)
		}
		return c.Members
	case opSetQuota:
		return st.setQuota(c)
	case opCheckpoint:
		return st.applyCheckpoint(index, c.Checkpoint)
	case opPutGroup:
		if c.Group == nil {
			return fmt.Errorf("catalog: a group command without a group")
		}
		return f.putGroup(index, c.Group)
	case opDeleteGroup:
		return f.deleteGroup(c.Name)
	}
	return fmt.Errorf("catalog: unknown op %d", c.Op)
}

// derive records a derived dataset over a committed parent; the same name,
// parent and stage again returns the entry as it is.
func (st *state) derive(index uint64, c *command) any {
	if d, ok := st.Datasets[c.Name]; ok {
		if d.DerivedFrom == c.Parent && d.Stage == c.Stage {
			return beginResult{existing: d}
		}
		if d.Derived() {
			return fmt.Errorf("%w: dataset %q is derived from %q with stage %q", ErrConflict, c.Name, d.DerivedFrom, d.Stage)
		}
		return fmt.Errorf("%w: dataset %q is registered with source %s", ErrConflict, c.Name, d.Source)
	}
	if _, ok := st.Pending[c.Name]; ok {
		return fmt.Errorf("%w: dataset %q is being registered", ErrConflict, c.Name)
	}
	p, ok := st.Datasets[c.Parent]
	if !ok {
		return fmt.Errorf("%w: dataset %q", ErrNotFound, c.Parent)
	}
	if p.Derived() {
		return fmt.Errorf("%w: %q is itself derived; derive from its parent %q", ErrConflict, c.Parent, p.DerivedFrom)
	}
	d := &Dataset{ID: st.NextID, Name: c.Name, Version: index, Manifest: p.Manifest, DerivedFrom: c.Parent, Stage: c.Stage}
	st.NextID++
	st.Datasets[c.Name] = d
	return d
}

func jobEqual(a, b *Job) bool {
	return a.Name == b.Name && a.Dataset == b.Dataset && a.Seed == b.Seed && a.WorldSize == b.WorldSize &&
		a.BatchSize == b.BatchSize && slices.Equal(a.Ranks, b.Ranks) && a.Version == b.Version
}

func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	// Committed entries are immutable, so copying the maps is enough; pending
	// manifests still grow and are copied whole.
	cp := &state{NextID: f.st.NextID, Datasets: maps.Clone(f.st.Datasets), Jobs: maps.Clone(f.st.Jobs), Pending: map[string]*pending{},
		Pins: map[string]map[uint64][]string{}, Checkpoints: maps.Clone(f.st.Checkpoints), Groups: maps.Clone(f.st.Groups)}
	for j, p := range f.st.Pins {
		cp.Pins[j] = maps.Clone(p)
	}
	for name, d := range cp.Datasets {
		if d.Derived() { // its manifest is the parent's: Restore links it again
			dc := *d
			dc.Manifest = nil
			cp.Datasets[name] = &dc
		}
	}
	for k, p := range f.st.Pending {
		pc := *p
		m := *p.Manifest
		m.Blocks, m.Starts, m.Sizes, m.Tags, m.Stamps = slices.Clone(m.Blocks), slices.Clone(m.Starts), slices.Clone(m.Sizes), slices.Clone(m.Tags), slices.Clone(m.Stamps)
		m.Shards, m.ShardOf, m.Offsets = slices.Clone(m.Shards), slices.Clone(m.ShardOf), slices.Clone(m.Offsets)
		pc.Manifest = &m
		cp.Pending[k] = &pc
	}
	return &snapshot{st: cp}, nil
}

func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	st := newState()
	if err := msgpack.NewDecoder(bufio.NewReader(rc)).Decode(st); err != nil {
		return fmt.Errorf("catalog: restore: %w", err)
	}
	if st.Datasets == nil {
		st.Datasets = map[string]*Dataset{}
	}
	for name, d := range st.Datasets {
		if d != nil && d.Derived() {
			continue // linked to its parent below
		}
		if d == nil || d.Manifest == nil || !d.Manifest.upgrade() || !d.Manifest.wellFormed() {
			return fmt.Errorf("catalog: restore: dataset %q has a malformed manifest", name)
		}
		d.Manifest.seal()
	}
	for name, d := range st.Datasets {
		if !d.Derived() {
			continue
		}
		p, ok := st.Datasets[d.DerivedFrom]
		if !ok || p.Derived() {
			return fmt.Errorf("catalog: restore: derived dataset %q has no parent %q", name, d.DerivedFrom)
		}
		d.Manifest = p.Manifest
	}
	if st.Pending == nil {
		st.Pending = map[string]*pending{}
	}
	for name, p := range st.Pending {
		if p == nil || p.Manifest == nil || !p.Manifest.upgrade() || !p.Manifest.wellFormed() {
			return fmt.Errorf("catalog: restore: the registration of %q has a malformed manifest", name)
		}
	}
	if st.Jobs == nil {
		st.Jobs = map[string]*Job{}
	}
	if st.Pins == nil {
		st.Pins = map[string]map[uint64][]string{}
	}
	if st.Groups == nil {
		st.Groups = map[string]*Group{}
	}
	f.mu.Lock()
	f.st = st
	f.applied.Store(0) // the snapshot's index is raft's to tell
	f.restored.Store(true)
	f.mu.Unlock()
	if f.onChange != nil {
		f.onChange()
	}
	items := 0
	for _, d := range st.Datasets {
		items += d.Manifest.Len()
	}
	if items >= largeRegistration && f.onLarge != nil {
		f.onLarge()
	}
	return nil
}

type snapshot struct{ st *state }

func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	bw := bufio.NewWriter(sink)
	if err := msgpack.NewEncoder(bw).Encode(s.st); err != nil {
		sink.Cancel()
		return fmt.Errorf("catalog: persist: %w", err)
	}
	if err := bw.Flush(); err != nil {
		sink.Cancel()
		return fmt.Errorf("catalog: persist: %w", err)
	}
	return sink.Close()
}

func (s *snapshot) Release() {}
