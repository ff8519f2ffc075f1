// Package derived is the prep cache (docs/api.md, "Prep cache"): datasets
// derived from a parent dataset whose items loaders write — the output of a
// deterministic prep stage (decode, resize) — so the stage runs once per item
// per cluster instead of once per epoch.
//
// A derived dataset is a catalog entry over its parent's manifest (same keys,
// same indices, nothing listed or read from storage). Each item is written
// once, at its owner, into the owner's store, where it is recomputable: it
// counts against --memory and is evicted before any item read from storage.
// Nothing is replicated: a node's loss loses its share, which loaders write
// again on their next pass. Reads go through the node's item path like any
// other item; only the storage read at its end is replaced by ErrNotWritten.
package derived

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/relay"
	"stallfree/store"
	"stallfree/transport"
)

// Errors the API maps to status codes.
var (
	// ErrNotWritten (404 {"error":"not written"}) is the catalog's: the node's
	// item path returns it too.
	ErrNotWritten = catalog.ErrNotWritten
	// ErrNotDerived: a write to a dataset read from storage (400).
	ErrNotDerived = errors.New("not a derived dataset")
	// ErrOutOfRange: a write past the last index (404).
	ErrOutOfRange = errors.New("index out of range")
	// ErrTooLarge: a body over --max-item-bytes (413).
	ErrTooLarge = errors.New("item too large")
	// ErrFull: the owner's memory holds only items it may not evict for a
	// derived one (507); the loader keeps its result uncached.
	ErrFull = errors.New("no room for derived items")
	// ErrInvalid: a malformed derived dataset (400).
	ErrInvalid = errors.New("invalid derived dataset")
)

// DefaultMaxItemBytes is --max-item-bytes' default, and the most a derived
// item may be whatever the flag says (it also bounds staged group batches,
// up to 1 GiB): what the peer transport moves in one push, so that a
// derived item can follow its owner when membership changes.
const DefaultMaxItemBytes = transport.MaxPush

// maxStage bounds the stage string (it names a cache, it is not data).
const maxStage = 256

// Host is the node as the prep cache sees it (clairvoyant.Host's pattern).
type Host interface {
	// Owner is the member owning item index of d, and whether it is this node.
	Owner(d *catalog.Dataset, index int) (owner string, self bool)
	// HTTPAddr is a member's HTTP address.
	HTTPAddr(member string) (string, bool)
	// Members are the live members.
	Members() []string
	// Derive records the derived dataset in the catalog through the one
	// way to the leader (control.Leader.DeriveDataset): applied here when
	// this node leads, relayed to the leader's HTTP API otherwise, and
	// applied here before it returns.
	Derive(ctx context.Context, name, parent, stage string) (info api.Dataset, created bool, err error)
}

// Config is what the prep cache needs beyond its host.
type Config struct {
	Name         string        // this node
	Relay        *relay.Client // to the other members' APIs
	MaxItemBytes int64         // 0: DefaultMaxItemBytes
	Logger       *slog.Logger
}

// Prep is safe for concurrent use.
type Prep struct {
	cfg   Config
	cat   *catalog.Catalog
	st    *store.Store
	host  Host
	relay *relay.Client
	// writing makes "is it there, else put it" one step for each item, so
	// that of two writers of one item exactly one gets 201 (and of
	// different bytes, the other 409). It is striped by key: writes of
	// different items (a minibatch's, from several loaders at once) hash
	// and compare side by side, and only the store's own lock orders their
	// copies into memory.
	writing [64]sync.Mutex
}

// New returns the prep cache of a node.
func New(cfg Config, cat *catalog.Catalog, st *store.Store, host Host) *Prep {
	if cfg.MaxItemBytes <= 0 || cfg.MaxItemBytes > DefaultMaxItemBytes {
		cfg.MaxItemBytes = DefaultMaxItemBytes
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Prep{cfg: cfg, cat: cat, st: st, host: host, relay: cfg.Relay}
}

// MaxItemBytes is the largest item a write may carry.
func (p *Prep) MaxItemBytes() int64 { return p.cfg.MaxItemBytes }

// Derive creates (idempotently) dataset name derived from parent with
// stage, on the leader or relayed to it. created is false when the same
// name, parent and stage existed.
func (p *Prep) Derive(ctx context.Context, name, parent, stage string) (info api.Dataset, created bool, err error) {
	// If chains, not a tagless switch: Go's coverage gives a case expression
	// no block, so mutation testing could not reach these.
	if parent == "" {
		return info, false, fmt.Errorf("%w: derived_from is empty", ErrInvalid)
	}
	if parent == name {
		return info, false, fmt.Errorf("%w: %q cannot be derived from itself", ErrInvalid, name)
	}
	if stage == "" || len(stage) > maxStage {
		return info, false, fmt.Errorf("%w: stage must be 1..%d bytes", ErrInvalid, maxStage)
	}
	if !utf8.ValidString(stage) || strings.IndexFunc(stage, unprintable) >= 0 {
		// A stage is shown wherever datasets are listed: escape codes in
		// it would be obeyed by an operator's terminal (issue 46).
		return info, false, fmt.Errorf("%w: stage %q: want printable UTF-8 (no control or format characters)", ErrInvalid, stage)
	}
	if pd, ok := p.cat.Dataset(parent); ok && pd.Derived() {
		// A request error, not a conflict: nothing under the name stands in
		// the way, the parent is the wrong kind. (Checked here, where the
		// leader's own catalog answers for it before anything is written.)
		return info, false, fmt.Errorf("%w: %q is itself derived (from %q); derive from %q", ErrInvalid, parent, pd.DerivedFrom, pd.DerivedFrom)
	}
	info, created, err = p.host.Derive(ctx, name, parent, stage)
	if err != nil {
		return info, false, err
	}
	p.st.MarkRecomputable(info.ID)
	return info, created, nil
}

// unprintable is a rune a terminal may act on rather than show: controls
// (C0, DEL, C1), format characters such as bidi overrides, and anything else
// unicode.IsPrint leaves out (the plain space is printable).
func unprintable(r rune) bool { return !unicode.IsPrint(r) }

// Info is a derived dataset's catalog entry as the API shows it, before
// Count adds what has been written.
func Info(d *catalog.Dataset) api.Dataset {
	return api.Dataset{Name: d.Name, Items: d.Manifest.Len(), Version: d.Version, ID: d.ID,
		DerivedFrom: d.DerivedFrom, Stage: d.Stage}
}

// Route says where item index of d is written: this node (self) or the
// owner's HTTP address. ok is false when the owner's address is unknown.
func (p *Prep) Route(d *catalog.Dataset, index int) (addr string, self, ok bool) {
	owner, self := p.host.Owner(d, index)
	if self {
		return "", true, true
	}
	addr, ok = p.host.HTTPAddr(owner)
	return addr, false, ok
}

// Check validates a write before its body is looked at or relayed.
func (p *Prep) Check(d *catalog.Dataset, index int, size int) error {
	if !d.Derived() {
		return fmt.Errorf("%w: %q is read from its source; only derived datasets take writes", ErrNotDerived, d.Name)
	}
	if index < 0 || index >= d.Manifest.Len() {
		return fmt.Errorf("%w: index %d, dataset %s has [0,%d)", ErrOutOfRange, index, d.Name, d.Manifest.Len())
	}
	if int64(size) > p.cfg.MaxItemBytes {
		return fmt.Errorf("%w: %d bytes; a derived item may have %d (--max-item-bytes, at most 64 MiB)", ErrTooLarge, size, p.cfg.MaxItemBytes)
	}
	return nil
}

// Write stores item index of derived dataset d in this node's memory,
// once: created is true for the first write, false for the same bytes
// again; different bytes are catalog.ErrConflict and the first stay.
func (p *Prep) Write(d *catalog.Dataset, index int, data []byte) (created bool, err error) {
	if err := p.Check(d, index, len(data)); err != nil {
		return false, err
	}
	k := store.MakeKey(d.ID, uint32(index))
	l := p.writeLock(k)
	l.Lock()
	defer l.Unlock()
	if same, held := p.held(k, data); held {
		if !same {
			return false, fmt.Errorf("%w: item %d of %s was written with other bytes (write-once)", catalog.ErrConflict, index, d.Name)
		}
		return false, nil
	}
	// Marked here too: the catalog watcher may not have seen the dataset yet.
	p.st.MarkRecomputable(d.ID)
	if _, err := p.st.PutSummed(k, data); err != nil {
		if errors.Is(err, store.ErrNotAdmitted) {
			return false, fmt.Errorf("%w: item %d of %s (%d bytes) not kept", ErrFull, index, d.Name, len(data))
		}
		return false, err
	}
	// A handoff could have put the item between the look and the put (Put
	// keeps what is there): say what the store holds.
	if same, held := p.held(k, data); held && !same {
		return false, fmt.Errorf("%w: item %d of %s was written with other bytes (write-once)", catalog.ErrConflict, index, d.Name)
	}
	return true, nil
}

// writeLock is the lock that orders the writes of k.
func (p *Prep) writeLock(k store.Key) *sync.Mutex {
	return &p.writing[uint64(k)%uint64(len(p.writing))]
}

// held reports whether k is resident, and whether it holds data.
func (p *Prep) held(k store.Key, data []byte) (same, held bool) {
	ref, ok := p.st.Get(k)
	if !ok {
		return false, false
	}
	defer ref.Release()
	return bytes.Equal(ref.Data, data), true
}

// Usage is what this node's memory holds of each dataset, parent and
// derived apart, by name (for /v1/stats).
func (p *Prep) Usage() []api.DatasetUsage {
	out := []api.DatasetUsage{}
	usage := p.st.Usage()
	for _, d := range p.cat.Datasets() { // by name
		u, ok := usage[d.ID]
		if !ok {
			continue
		}
		out = append(out, api.DatasetUsage{Name: d.Name, ID: d.ID, DerivedFrom: d.DerivedFrom, Items: u.Items, Bytes: u.Bytes})
	}
	return out
}

// Count fills in Written and Bytes of the derived datasets among infos,
// summed over every live member's /v1/stats.
//
// Why gathered, not counted in the catalog: a write is one item on one
// node, an eviction or a node's loss takes items away again, and nothing
// else in the prep cache needs consensus. Counting in raft would cost a
// log entry per item (a million for ImageNet) and still be wrong after an
// eviction. What each owner's memory holds is the truth, so every node
// asks every member and adds up: the same answer on every node, at the
// cost of one small request per member when someone asks.
func (p *Prep) Count(ctx context.Context, infos []api.Dataset) {
	want := false
	for _, in := range infos {
		want = want || in.DerivedFrom != ""
	}
	if !want {
		return
	}
	type total struct {
		items int
		bytes uint64
	}
	var mu sync.Mutex
	sums := map[uint32]total{}
	add := func(us []api.DatasetUsage) {
		mu.Lock()
		defer mu.Unlock()
		for _, u := range us {
			if u.DerivedFrom != "" {
				t := sums[u.ID]
				t.items += u.Items
				t.bytes += u.Bytes
				sums[u.ID] = t
			}
		}
	}
	add(p.Usage())
	var wg sync.WaitGroup
	for _, m := range p.host.Members() {
		if m == p.cfg.Name {
			continue
		}
		addr, ok := p.host.HTTPAddr(m)
		if !ok {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			us, err := p.memberUsage(ctx, addr)
			if err != nil {
				p.cfg.Logger.Debug("counting derived items", "member", m, "err", err)
				return
			}
			add(us)
		}()
	}
	wg.Wait()
	for i := range infos {
		if infos[i].DerivedFrom == "" {
			continue
		}
		t := sums[infos[i].ID]
		n := t.items
		infos[i].Written, infos[i].Bytes = &n, int64(t.bytes)
	}
}

// memberUsage reads a member's per-dataset usage from its /v1/stats.
func (p *Prep) memberUsage(ctx context.Context, addr string) ([]api.DatasetUsage, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	var st api.Stats
	if _, err := p.relay.JSON(ctx, http.MethodGet, addr, "/v1/stats", nil, &st, nil, 16<<20); err != nil {
		return nil, fmt.Errorf("stats from %s: %w", addr, err)
	}
	return st.Datasets, nil
}

// Sync follows the catalog: derived datasets are marked recomputable in the
// store, and what the store holds of derived datasets that are gone (deleted,
// or deleted with their parent) is dropped. The node calls it after every
// catalog change.
func (p *Prep) Sync() {
	live := map[uint32]bool{}
	for _, d := range p.cat.Datasets() {
		if d.Derived() {
			live[d.ID] = true
			p.st.MarkRecomputable(d.ID)
		}
	}
	for _, id := range p.st.RecomputableDatasets() {
		if !live[id] {
			p.st.DeleteDataset(id)
		}
	}
}
