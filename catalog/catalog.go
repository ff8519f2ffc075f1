// Package catalog is the cluster's small, strongly consistent state: datasets
// with their manifests, and training jobs. It is replicated with raft, with
// on-disk logs under the node's data directory.
package catalog

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb/v2"
	"github.com/vmihailenco/msgpack/v5"

	"stallfree/logbridge"
	"stallfree/source"
)

// maxChunkKeyBytes keeps every raft entry well under 1 MiB, whatever the
// dataset size.
const maxChunkKeyBytes = 512 << 10

// raftLogCache entries are kept in memory for replication: a few manifest
// chunks' worth (~200 KB each once coded).
const raftLogCache = 32

var (
	// ErrNotLeader means this node cannot write; forward to Leader().
	ErrNotLeader = errors.New("not the raft leader")
	// ErrNoLeader means no quorum is reachable: catalog writes fail with 503.
	ErrNoLeader = errors.New("no raft leader (no quorum)")
)

// Config says where the catalog lives and how it talks to its peers.
type Config struct {
	NodeID    string
	Bind      string // raft TCP listen address
	Advertise string // address other nodes dial; defaults to Bind
	Dir       string
	Bootstrap bool
	// Rejoin says the node has seeds to join through (--join). A node that
	// left cleanly (SIGTERM, MarkLeft) is no longer in the configuration
	// recorded in its data dir; with seeds, --bootstrap on that state means
	// "come back" (the leader adds it again), as a StatefulSet's ordinal 0
	// restarting after a rolling update does, instead of a refusal.
	Rejoin bool
	Logger *slog.Logger
	// Timing is how fast raft notices a lost leader and elects another:
	// LANTiming (the zero Timing means it) or LocalTiming.
	Timing Timing
	// Key authenticates every raft connection (both ends must hold it).
	Key []byte
}

// Timing is a raft timing profile (memberlist's DefaultLANConfig and
// DefaultLocalConfig, for raft).
type Timing struct {
	// HeartbeatTimeout is how long a follower goes without hearing from the
	// leader before it stands for election.
	HeartbeatTimeout time.Duration
	// ElectionTimeout is how long a candidate waits for votes.
	ElectionTimeout time.Duration
	// LeaderLeaseTimeout is how long a leader stays leader without reaching
	// a quorum.
	LeaderLeaseTimeout time.Duration
}

// LANTiming is raft's own defaults, for hosts on one network.
func LANTiming() Timing {
	d := raft.DefaultConfig()
	return Timing{HeartbeatTimeout: d.HeartbeatTimeout, ElectionTimeout: d.ElectionTimeout, LeaderLeaseTimeout: d.LeaderLeaseTimeout}
}

// LocalTiming elects within a second, for nodes on one host (loopback tests
// and demos), where no heartbeat is late but for a stopped node.
func LocalTiming() Timing {
	return Timing{HeartbeatTimeout: 300 * time.Millisecond, ElectionTimeout: 300 * time.Millisecond,
		LeaderLeaseTimeout: 150 * time.Millisecond}
}

// DefaultLANConfig is a Config with LANTiming; the caller fills in the rest.
func DefaultLANConfig() Config { return Config{Timing: LANTiming()} }

// DefaultLocalConfig is a Config with LocalTiming; the caller fills in the
// rest.
func DefaultLocalConfig() Config { return Config{Timing: LocalTiming()} }

// Catalog is a raft-replicated registry. Reads are served from the local FSM
// (possibly a little behind the leader); writes go through the leader.
type Catalog struct {
	raft        *raft.Raft
	settledTerm atomic.Uint64 // the term settleAsLeader last settled
	fsm         *fsm
	trans       *raft.NetworkTransport
	store       *raftboltdb.BoltStore
	log         *slog.Logger
	mu          sync.Mutex

	updMu   sync.Mutex
	updated chan struct{} // closed and replaced after every applied change

	releasing atomic.Bool // a releaseSoon is pending
	dir, id   string      // --data-dir and this node's raft ID (MarkLeft)
	closed    chan struct{}
	closeOnce sync.Once
}

// Open starts the local raft member, bootstrapping a one-voter cluster when
// asked and the data directory is empty. A restarted node recovers its
// catalog from its own log and snapshots.
func Open(cfg Config) (*Catalog, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.Dir, 0o750); err != nil {
		return nil, fmt.Errorf("catalog: %w", err)
	}
	adv := cfg.Advertise
	if adv == "" {
		adv = cfg.Bind
	}
	advAddr, err := net.ResolveTCPAddr("tcp", adv)
	if err != nil {
		return nil, fmt.Errorf("catalog: raft advertise %q: %w", adv, err)
	}
	if advAddr.IP == nil || advAddr.IP.IsUnspecified() {
		return nil, fmt.Errorf("catalog: raft address %q is not advertisable; set --advertise", adv)
	}
	rc := raft.DefaultConfig()
	rc.LocalID = raft.ServerID(cfg.NodeID)
	rc.Logger = logbridge.Raft(cfg.Logger)
	rc.SnapshotThreshold = 1024
	// A follower further behind than this gets a snapshot instead of the
	// log: the log holds manifest chunks, and keeping 10,240 of them (raft's
	// default) would keep gigabytes on disk for a large dataset.
	rc.TrailingLogs = 256
	if cfg.Timing == (Timing{}) {
		cfg.Timing = LANTiming()
	}
	rc.HeartbeatTimeout, rc.ElectionTimeout = cfg.Timing.HeartbeatTimeout, cfg.Timing.ElectionTimeout
	rc.LeaderLeaseTimeout = cfg.Timing.LeaderLeaseTimeout
	bs, err := raftboltdb.New(raftboltdb.Options{Path: filepath.Join(cfg.Dir, "raft.db")})
	if err != nil {
		return nil, fmt.Errorf("catalog: raft log: %w", err)
	}
	snaps, err := raft.NewFileSnapshotStore(cfg.Dir, 2, io.Discard)
	if err != nil {
		bs.Close()
		return nil, fmt.Errorf("catalog: snapshots: %w", err)
	}
	stream, err := newAuthStream(cfg.Bind, advAddr, cfg.Key, cfg.Logger)
	if err != nil {
		bs.Close()
		return nil, fmt.Errorf("catalog: raft transport: %w", err)
	}
	tr := raft.NewNetworkTransport(stream, 3, 10*time.Second, io.Discard)
	c := &Catalog{fsm: &fsm{st: newState()}, trans: tr, store: bs, log: cfg.Logger, updated: make(chan struct{}), closed: make(chan struct{}),
		dir: cfg.Dir, id: cfg.NodeID}
	c.fsm.onChange = c.notify
	c.fsm.onLarge = c.releaseSoon
	// The leader replicates recent entries from memory instead of reading
	// them back through bolt's mmap, which would make every manifest chunk
	// it sent resident in the node's RSS.
	logs, err := raft.NewLogCache(raftLogCache, bs)
	if err != nil {
		tr.Close()
		bs.Close()
		return nil, fmt.Errorf("catalog: raft log cache: %w", err)
	}
	r, err := raft.NewRaft(rc, c.fsm, logs, bs, snaps, tr)
	if err != nil {
		tr.Close()
		bs.Close()
		return nil, fmt.Errorf("catalog: raft: %w", err)
	}
	c.raft = r
	if cfg.Bootstrap {
		has, err := raft.HasExistingState(bs, bs, snaps)
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("catalog: %w", err)
		}
		if !has {
			self := raft.Server{Suffrage: raft.Voter, ID: rc.LocalID, Address: tr.LocalAddr()}
			if err := r.BootstrapCluster(raft.Configuration{Servers: []raft.Server{self}}).Error(); err != nil && !errors.Is(err, raft.ErrCantBootstrap) {
				c.Close()
				return nil, fmt.Errorf("catalog: bootstrap: %w", err)
			}
		} else if err := c.resumeOrRefuse(cfg); err != nil {
			c.Close()
			return nil, err
		}
	}
	return c, nil
}

// resumeOrRefuse decides what --bootstrap means on a data directory that
// already holds raft state (an earlier run's, say): when this node is a
// member of the cluster recorded there, it resumes that cluster and says so
// once; otherwise the state belongs to a cluster this node is not part of,
// and mixing the two would be silent corruption, so it refuses, naming the
// directory and the way out.
func (c *Catalog) resumeOrRefuse(cfg Config) error {
	f := c.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return fmt.Errorf("catalog: reading the raft configuration in %s: %w", cfg.Dir, err)
	}
	var names []string
	member := false
	for _, s := range f.Configuration().Servers {
		names = append(names, string(s.ID))
		member = member || string(s.ID) == cfg.NodeID
	}
	slices.Sort(names)
	if !member && cfg.Rejoin && c.leftCleanly(cfg.Dir) {
		c.log.Info("--bootstrap: this node is not in the cluster recorded in --data-dir (it left); joining it again through --join",
			"data_dir", cfg.Dir, "members", names)
		return nil
	}
	if !member {
		return fmt.Errorf("catalog: --data-dir %s holds raft state of a cluster this node (%s) is not a member of (members: [%s]); "+
			"to start a new cluster remove that directory (rm -r %s) or give --data-dir a fresh one; to rejoin that cluster "+
			"start it with --join and no --bootstrap", cfg.Dir, cfg.NodeID, strings.Join(names, " "), cfg.Dir)
	}
	c.log.Info("--bootstrap: resuming the cluster recorded in --data-dir (remove the directory to start a new one)",
		"data_dir", cfg.Dir, "members", names, "last_index", c.raft.LastIndex())
	return nil
}

// releaseDelay is how long after a large commit the memory is handed back:
// long enough for the registering request to have returned and dropped its
// listing, well within the 10 s in which RSS is expected to settle.
const releaseDelay = time.Second

// releaseSoon collects and returns free memory to the OS shortly after a
// large registration or restore. Without it the garbage (3-10x the manifest)
// stays resident until the heap reaches its headroom, which an idle catalog
// may never do.
func (c *Catalog) releaseSoon() {
	if !c.releasing.CompareAndSwap(false, true) {
		return
	}
	go func() {
		select {
		case <-c.closed:
		case <-time.After(releaseDelay):
			// Two collections: buffers the first finds idle in a
			// sync.Pool (the encoder's) survive it as the pool's victims.
			runtime.GC()
			debug.FreeOSMemory()
		}
		c.releasing.Store(false)
	}()
}

// Close stops raft and closes its stores.
func (c *Catalog) Close() error {
	c.closeOnce.Do(func() { close(c.closed) })
	err := c.raft.Shutdown().Error()
	// Close does not close the pooled connections to other members, whose
	// handlers would wait on them for as long as those members run.
	c.trans.CloseStreams()
	c.trans.Close()
	if cerr := c.store.Close(); err == nil {
		err = cerr
	}
	return err
}

func (c *Catalog) notify() {
	c.updMu.Lock()
	close(c.updated)
	c.updated = make(chan struct{})
	c.updMu.Unlock()
}

// Updated returns a channel closed at the next applied change; any number of
// waiters may use it.
func (c *Catalog) Updated() <-chan struct{} {
	c.updMu.Lock()
	defer c.updMu.Unlock()
	return c.updated
}

// AppliedIndex is the raft index of the last change applied here. Raft
// counts an entry applied once it hands it to the FSM, a moment before the
// FSM has applied it: a follower waiting for a relayed write by raft's count
// could read the catalog without it. So the FSM's own count comes first;
// raft's serves until the FSM has applied a command since a start or a
// snapshot restore.
func (c *Catalog) AppliedIndex() uint64 {
	if a := c.fsm.applied.Load(); a > 0 {
		return a
	}
	return c.raft.AppliedIndex()
}

// WaitFor blocks until cond holds (checked after every applied change) or ctx
// ends; it reports whether cond held. A follower uses it to read its own
// writes, which the leader applied first.
func (c *Catalog) WaitFor(ctx context.Context, cond func() bool) bool {
	for {
		ch := c.Updated()
		if cond() {
			return true
		}
		select {
		case <-ctx.Done():
			return cond()
		case <-ch:
		}
	}
}

// CaughtUp reports whether this member knows a leader and has applied
// everything it knows to be committed.
func (c *Catalog) CaughtUp() (bool, string) {
	if c.raft.Leader() == "" {
		return false, "no raft leader known yet"
	}
	commit, err := strconv.ParseUint(c.raft.Stats()["commit_index"], 10, 64)
	if err != nil {
		return false, "raft commit index unknown"
	}
	if applied := c.raft.AppliedIndex(); applied < commit {
		return false, fmt.Sprintf("catalog catching up (applied %d of %d)", applied, commit)
	}
	return true, ""
}

// LastIndex is the index of the last entry in this node's raft log.
func (c *Catalog) LastIndex() uint64 { return c.raft.LastIndex() }

// HasApplied reports whether this node's catalog holds every change up to
// raft index (of any kind, as LastIndex counts). Raft's own count
// (LogApplied) runs ahead of the FSM, by a whole batch of commands just
// after a start, so it is not enough: when the entry at index is a command,
// the FSM must have applied it (commands apply in order); when it is not (a
// no-op, a configuration) or lies in a snapshot, raft's count is the word.
// The catch-up gate opens on it.
func (c *Catalog) HasApplied(index uint64) bool {
	if c.raft.AppliedIndex() < index {
		return false
	}
	if a := c.fsm.applied.Load(); a >= index || (a == 0 && c.fsm.restored.Load()) {
		return true
	}
	var l raft.Log
	if err := c.store.GetLog(index, &l); err != nil {
		return true // compacted into the snapshot this node restored
	}
	return l.Type != raft.LogCommand
}

// LogApplied is the index of the last raft entry of any kind (commands,
// configuration changes, a new term's no-op) this node has applied; a
// moment ahead of AppliedIndex for commands, and unlike it comparable with
// LastIndex, which counts every kind.
func (c *Catalog) LogApplied() uint64 { return c.raft.AppliedIndex() }

// IsLeader reports whether this node is the raft leader.
func (c *Catalog) IsLeader() bool { return c.raft.State() == raft.Leader }

// Leader returns the leader's node ID, or "" when there is none.
func (c *Catalog) Leader() string {
	_, id := c.raft.LeaderWithID()
	return string(id)
}

// WaitLeader blocks until some node leads or ctx ends.
func (c *Catalog) WaitLeader(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for c.Leader() == "" {
		select {
		case <-ctx.Done():
			return fmt.Errorf("catalog: %w: %w", ErrNoLeader, ctx.Err())
		case <-t.C:
		}
	}
	return nil
}

func (c *Catalog) apply(cmd *command) (any, error) {
	if c.raft.State() != raft.Leader {
		if c.Leader() == "" {
			return nil, ErrNoLeader
		}
		return nil, ErrNotLeader
	}
	b, err := msgpack.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("catalog: encode: %w", err)
	}
	f := c.raft.Apply(b, 10*time.Second)
	if err := f.Error(); err != nil {
		switch {
		case errors.Is(err, raft.ErrNotLeader), errors.Is(err, raft.ErrLeadershipLost):
			return nil, fmt.Errorf("%w: %w", ErrNoLeader, err)
		case errors.Is(err, raft.ErrEnqueueTimeout):
			return nil, fmt.Errorf("%w: %w", ErrNoLeader, err)
		}
		return nil, fmt.Errorf("catalog: apply: %w", err)
	}
	if err, ok := f.Response().(error); ok {
		return nil, err
	}
	return f.Response(), nil
}

// RegisterDataset records a dataset and its manifest. Registering the same
// name with the same source again returns the existing entry unchanged; a
// different source is ErrConflict. Must run on the leader.
// leftOut counts what the source's listing left out (a tar source's unsafe
// members), kept with the dataset so users can see it.
func (c *Catalog) RegisterDataset(name, src string, entries []source.Entry, leftOut int) (*Dataset, bool, error) {
	return c.register(name, src, entries, leftOut, false, 0)
}

// RefreshDataset records a new listing of a registered dataset's source as
// a new version: a new ID (nothing cached under the old one is served for
// it), its quota kept, the datasets derived from it deleted. A dataset not
// registered yet is registered; another source under the name is
// ErrConflict, and so is a derived dataset. from is the version the
// listing was compared with (0: any): when the name holds another by then,
// nothing is recorded and the error is ErrMoved, or ErrNotFound when the
// name was deleted meanwhile. Must run on the leader.
func (c *Catalog) RefreshDataset(name, src string, from uint64, entries []source.Entry, leftOut int) (*Dataset, error) {
	d, _, err := c.register(name, src, entries, leftOut, true, from)
	return d, err
}

func (c *Catalog) register(name, src string, entries []source.Entry, leftOut int, refresh bool, from uint64) (*Dataset, bool, error) {
	c.mu.Lock() // one registration at a time keeps chunk streams from interleaving
	defer c.mu.Unlock()
	// Checked here, on the leader, under the lock every registration and
	// delete takes, and not in the log's apply: nodes of a version before
	// this check apply the same entries alike during an upgrade.
	if refresh && from != 0 {
		d, ok := c.dataset(name)
		if !ok {
			return nil, false, fmt.Errorf("%w: dataset %q was deleted while its source was listed again", ErrNotFound, name)
		}
		if d.Version != from {
			return nil, false, fmt.Errorf("%w: dataset %q is at version %d, not the %d its source was listed against", ErrMoved, name, d.Version, from)
		}
	}
	token := newToken()
	res, err := c.apply(&command{Op: opBegin, Name: name, Source: src, Token: token, Count: len(entries), Refresh: refresh})
	if err != nil {
		return nil, false, err
	}
	if br := res.(beginResult); br.existing != nil {
		return br.existing, false, nil
	}
	for x, ch := range chunks(entries, maxChunkKeyBytes) {
		m := NewManifest(ch)
		if x == 0 {
			m.LeftOut = leftOut
		}
		if _, err := c.apply(&command{Op: opChunk, Name: name, Token: token, Chunk: m}); err != nil {
			return nil, false, err
		}
	}
	res, err = c.apply(&command{Op: opCommit, Name: name, Token: token})
	if err != nil {
		return nil, false, err
	}
	return res.(*Dataset), true, nil
}

// DeriveDataset records a derived dataset over parent: the parent's keys and
// indices, items written by loaders. The same name, parent and stage again
// returns the existing entry (created false); anything else under the name
// is ErrConflict, a missing parent ErrNotFound. Must run on the leader.
func (c *Catalog) DeriveDataset(name, parent, stage string) (*Dataset, bool, error) {
	res, err := c.apply(&command{Op: opDerive, Name: name, Parent: parent, Stage: stage})
	if err != nil {
		return nil, false, err
	}
	if br, ok := res.(beginResult); ok {
		return br.existing, false, nil
	}
	return res.(*Dataset), true, nil
}

// DeleteDataset removes a dataset (and the datasets derived from it). Must
// run on the leader. It waits for a registration in flight (the lock): a
// refresh that began is committed, then deleted, and one that lists
// meanwhile finds the name gone.
func (c *Catalog) DeleteDataset(name string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	_, err := c.apply(&command{Op: opDeleteDataset, Name: name})
	return err
}

// Dataset returns a committed dataset from the local replica.
func (c *Catalog) Dataset(name string) (*Dataset, bool) {
	d, ok := c.dataset(name)
	if !ok && c.settleAsLeader() {
		d, ok = c.dataset(name)
	}
	return d, ok
}

func (c *Catalog) dataset(name string) (*Dataset, bool) {
	c.fsm.mu.RLock()
	defer c.fsm.mu.RUnlock()
	d, ok := c.fsm.st.Datasets[name]
	return d, ok
}

// settleAsLeader makes sure that this node, when it leads, has applied every
// entry committed before its term: a new leader, or a lone voter restarted on
// its log, applies them only once its first entry of the term commits, and
// would answer "not found" for a dataset it is about to learn of. One barrier
// per term; false when this node does not lead.
func (c *Catalog) settleAsLeader() bool {
	if !c.IsLeader() {
		return false
	}
	term := c.raft.CurrentTerm()
	if c.settledTerm.Load() == term {
		return true
	}
	if err := c.raft.Barrier(2 * time.Second).Error(); err != nil {
		return false
	}
	c.settledTerm.Store(term)
	return true
}

// Datasets lists committed datasets by name.
func (c *Catalog) Datasets() []*Dataset {
	c.fsm.mu.RLock()
	defer c.fsm.mu.RUnlock()
	return byName(c.fsm.st.Datasets)
}

// byName returns a map's values in the order of their keys (the names).
func byName[T any](m map[string]T) []T {
	names := slices.Sorted(maps.Keys(m))
	out := make([]T, len(names))
	for i, n := range names {
		out[i] = m[n]
	}
	return out
}

// PutJob registers or replaces a job (idempotent for an identical spec).
func (c *Catalog) PutJob(j Job) (*Job, error) {
	res, err := c.apply(&command{Op: opPutJob, Name: j.Name, Job: &j})
	if err != nil {
		return nil, err
	}
	return res.(*Job), nil
}

// DeleteJob removes a job.
func (c *Catalog) DeleteJob(name string) error {
	_, err := c.apply(&command{Op: opDeleteJob, Name: name})
	return err
}

// Job returns a job from the local replica.
func (c *Catalog) Job(name string) (*Job, bool) {
	j, ok := c.job(name)
	if !ok && c.settleAsLeader() {
		j, ok = c.job(name)
	}
	return j, ok
}

func (c *Catalog) job(name string) (*Job, bool) {
	c.fsm.mu.RLock()
	defer c.fsm.mu.RUnlock()
	j, ok := c.fsm.st.Jobs[name]
	return j, ok
}

// Jobs lists jobs by name.
func (c *Catalog) Jobs() []*Job {
	c.fsm.mu.RLock()
	defer c.fsm.mu.RUnlock()
	return byName(c.fsm.st.Jobs)
}

// PinEpoch fixes the member set of a job's epoch; the first pin wins and is
// returned. Leader only.
func (c *Catalog) PinEpoch(job string, epoch uint64, members []string) ([]string, error) {
	res, err := c.apply(&command{Op: opPinEpoch, Name: job, Epoch: epoch, Members: members})
	if err != nil {
		return nil, err
	}
	return res.([]string), nil
}

// EpochMembers returns the pinned member set of a job's epoch.
func (c *Catalog) EpochMembers(job string, epoch uint64) ([]string, bool) {
	c.fsm.mu.RLock()
	defer c.fsm.mu.RUnlock()
	m, ok := c.fsm.st.Pins[job][epoch]
	return m, ok
}

// LatestEpoch returns the highest pinned epoch of a job.
func (c *Catalog) LatestEpoch(job string) (uint64, bool) {
	c.fsm.mu.RLock()
	defer c.fsm.mu.RUnlock()
	var latest uint64
	found := false
	for e := range c.fsm.st.Pins[job] {
		if !found || e > latest {
			latest, found = e, true
		}
	}
	return latest, found
}

func newToken() string {
	b := make([]byte, 12)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Server is a raft configuration entry.
type Server struct {
	ID      string
	Address string
	Voter   bool
}

// Servers returns the current raft configuration.
func (c *Catalog) Servers() ([]Server, error) {
	f := c.raft.GetConfiguration()
	if err := f.Error(); err != nil {
		return nil, err
	}
	var out []Server
	for _, s := range f.Configuration().Servers {
		out = append(out, Server{ID: string(s.ID), Address: string(s.Address), Voter: s.Suffrage == raft.Voter})
	}
	return out, nil
}

// AddServer adds (or re-addresses) a member; voter or non-voter. Leader only.
func (c *Catalog) AddServer(id, addr string, voter bool) error {
	var f raft.IndexFuture
	if voter {
		f = c.raft.AddVoter(raft.ServerID(id), raft.ServerAddress(addr), 0, 10*time.Second)
	} else {
		f = c.raft.AddNonvoter(raft.ServerID(id), raft.ServerAddress(addr), 0, 10*time.Second)
	}
	return f.Error()
}

// leftMarker is the file a node writes in its data dir once it has left
// the raft configuration cleanly: on a restart it tells "this node left
// this cluster" from "another cluster's state", which --bootstrap must
// still refuse to mix with, and it names the members to join again through.
const leftMarker = "LEFT"

// leftRecord is leftMarker's contents (JSON).
type leftRecord struct {
	Node string `json:"node"`
	// Seeds are the gossip addresses of the members alive when this node
	// left: a node started with no --join (the one that bootstrapped) has
	// nobody else to ask.
	Seeds []string `json:"seeds"`
}

// MarkLeft records in the data dir that this node left the configuration
// cleanly (cluster.Leave), and the members it left behind, so that a restart
// comes back to them, even with the command line it was first started with.
func (c *Catalog) MarkLeft(seeds []string) error {
	if c.dir == "" { // never the working directory: it may be a checkout
		return errors.New("catalog: no data dir to record the leave in")
	}
	b, err := json.Marshal(leftRecord{Node: c.id, Seeds: seeds})
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(c.dir, leftMarker), b, 0o644)
}

// LeftSeeds reads what a clean leave recorded in dir: whether this node
// left its cluster, and the gossip addresses of the members it left.
func LeftSeeds(dir string) (seeds []string, left bool) {
	b, err := os.ReadFile(filepath.Join(dir, leftMarker))
	if err != nil {
		return nil, false
	}
	var r leftRecord
	if json.Unmarshal(b, &r) != nil {
		return nil, true // written by hand, or cut short: it still says the node left
	}
	return r.Seeds, true
}

func (c *Catalog) leftCleanly(dir string) bool {
	_, left := LeftSeeds(dir)
	return left
}

// TransferLeadership hands the lead to another voter and waits until it has
// it (or raft gives up). Leader only.
func (c *Catalog) TransferLeadership() error { return c.raft.LeadershipTransfer().Error() }

// RemoveServer removes a member from the raft configuration. Leader only.
func (c *Catalog) RemoveServer(id string) error {
	return c.raft.RemoveServer(raft.ServerID(id), 0, 10*time.Second).Error()
}
