// Package control holds the catalog's rules as every caller meets them: the
// checks a registration, a job or an epoch pin must pass, the one way to the
// raft leader (Leader: applied here when this node leads, relayed over HTTP
// when another does), and reads that give a follower a moment to catch up,
// so a caller reads its own writes. The item path (package node) and the
// HTTP API sit above it; the catalog (raft) below.
package control

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/catchup"
	"stallfree/locality"
	"stallfree/relay"
	"stallfree/source"
)

// Errors the API maps to status codes.
var (
	ErrForbiddenSource = errors.New("source not allowed")
	ErrBadRequest      = errors.New("bad request")
)

// followerGrace is how long a follower waits for a dataset or job it does not
// know yet, or for a leader: a registration acknowledged by the leader
// reaches followers a moment later, and a restarted follower hears from the
// leader a moment after it starts serving.
const followerGrace = time.Second

// catchUpWait bounds how long a follower waits for a dataset the leader
// already has: raft's replication backoff to a restarted follower reaches
// about ten seconds.
const catchUpWait = 15 * time.Second

// Config is what control needs to know about its node.
type Config struct {
	// Name is the node's raft and gossip name.
	Name string
	// HTTPAdvert is this node's HTTP address, the leader's address when
	// this node leads.
	HTTPAdvert string
	// Relay is the node's client to the other nodes' APIs, through which
	// writes reach the leader; nil: New builds one from Name and Token.
	Relay *relay.Client
	// Token is the API's bearer token, which this node presents when it
	// relays a request to the leader (when New builds Relay).
	Token string
	// AllowSources are the --allow-source prefixes, resolved (Resolve);
	// empty allows every source.
	AllowSources []string
	// S3 is how s3:// datasets are reached when they are listed.
	S3 source.S3Config
	// Logger receives what control has to say; nil: slog.Default().
	Logger *slog.Logger
	// RelayedRead, when set, is called for every read the leader answered
	// for this follower (ReadFromLeader), so the node can count it.
	RelayedRead func()
	// Replanned, when set, is called after a resumed epoch's order is
	// re-split, so a read-ahead can follow the new order. It must not block.
	Replanned func()
}

// Relay is the node's client to the other nodes' APIs (Config.Relay), for
// the node's other parts to share.
func (c *Control) Relay() *relay.Client { return c.client }

// Members is what control needs from the cluster: whom an epoch is pinned to
// and where each member's HTTP API is. node.Peers is one.
type Members interface {
	Members() []string
	HTTPAddr(member string) (string, bool)
}

// Control is safe for concurrent use.
type Control struct {
	cfg     Config
	log     *slog.Logger
	cat     *catalog.Catalog
	members Members
	local   localLeader
	relay   relayLeader
	client  *relay.Client
	gate    *catchup.Gate // catalog reads wait for it (catchup.go)

	plans plans

	mu sync.Mutex
	// registrations are the listings this node ran, by dataset name.
	registrations map[string]*registration
	// listing counts the source listings running (at most maxListings).
	listing int
	// resumed are re-split remainders of interrupted epochs (ResumedOrder);
	// active is, per job, the one its ranks here asked for last.
	resumed map[resumeKey]*locality.EpochPlan
	active  map[string]resumeKey
	// positions are what ranks reported, by job and rank.
	positions map[string]map[int]rankPosition
}

// New returns the catalog's rules for one node. members may change what it
// answers over time (a node joining its cluster), never its identity.
func New(cfg Config, cat *catalog.Catalog, members Members) *Control {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Relay == nil {
		cfg.Relay = relay.New(cfg.Name, cfg.Token)
	}
	c := &Control{cfg: cfg, log: cfg.Logger, cat: cat, members: members,
		client:        cfg.Relay,
		registrations: map[string]*registration{}, resumed: map[resumeKey]*locality.EpochPlan{},
		active: map[string]resumeKey{}, positions: map[string]map[int]rankPosition{}}
	c.gate = catchup.New(catchupSource{c})
	c.local = localLeader{c}
	c.relay = relayLeader{c}
	return c
}

// Resolve resolves --allow-source prefixes: they are compared resolved, so a
// symlink inside an allowed prefix must not lead out of it, and an allowed
// path reached through a symlink is still allowed.
func Resolve(prefixes []string) ([]string, error) {
	out := make([]string, len(prefixes))
	for i, p := range prefixes {
		real, err := source.Resolve(p)
		if err != nil {
			return nil, fmt.Errorf("--allow-source: %w", err)
		}
		out[i] = real
	}
	return out, nil
}

// MaxSourceLen bounds a source's spelling: a path (PATH_MAX is 4096) or
// bucket and prefix with its scheme.
const MaxSourceLen = 4096 + 64

// CheckSource normalizes spec and applies --allow-source.
func (c *Control) CheckSource(spec string) (string, error) {
	if len(spec) > MaxSourceLen {
		return "", fmt.Errorf("%w: a source of %d bytes: at most %d", ErrBadRequest, len(spec), MaxSourceLen)
	}
	norm, err := source.Normalize(spec)
	if err != nil {
		return "", fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if err := c.Allowed(norm); err != nil {
		return "", err
	}
	return norm, nil
}

// Allowed applies --allow-source to where the normalized source norm really
// is, symlinks followed; it is checked at registration and again whenever a
// node opens the source, so a symlink changed in between cannot lead out
// either.
func (c *Control) Allowed(norm string) error {
	if len(c.cfg.AllowSources) == 0 {
		return nil
	}
	real, err := source.Resolve(norm)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return c.allowedAt(norm, real)
}

// AllowedOpened applies --allow-source to src, opened from norm: to where
// the directory it holds open really is. A symlink on the way can be
// swapped between Allowed's look and the open (a race won 5 times in 300
// tries let a dataset list a directory outside every prefix), so the check
// that counts is this one, on what was opened. The caller closes src on
// an error.
func (c *Control) AllowedOpened(norm string, src source.Source) error {
	if len(c.cfg.AllowSources) == 0 {
		return nil
	}
	real, ok := source.Where(src)
	if !ok {
		return c.Allowed(norm)
	}
	return c.allowedAt(norm, real)
}

func (c *Control) allowedAt(norm, real string) error {
	for _, p := range c.cfg.AllowSources {
		if source.Within(real, p) {
			return nil
		}
	}
	if real != norm {
		return fmt.Errorf("%w: %s (really %s) is outside every --allow-source prefix", ErrForbiddenSource, norm, real)
	}
	return fmt.Errorf("%w: %s is outside every --allow-source prefix", ErrForbiddenSource, norm)
}

// DatasetInfo is a dataset's catalog entry as the API shows it.
func DatasetInfo(d *catalog.Dataset) api.Dataset {
	if d.Derived() { // the prep cache's (derived.Info): no source, its own bytes counted over the members
		return api.Dataset{Name: d.Name, Items: d.Manifest.Len(), Version: d.Version, ID: d.ID,
			DerivedFrom: d.DerivedFrom, Stage: d.Stage}
	}
	return api.Dataset{Name: d.Name, Source: d.Source, Items: d.Manifest.Len(), Bytes: d.Manifest.TotalBytes(),
		Version: d.Version, ID: d.ID, Samples: d.Manifest.Samples(), Shards: len(d.Manifest.Shards), LeftOut: d.Manifest.LeftOut,
		Quota: d.Quota}
}

func jobInfo(j *catalog.Job) api.Job {
	out := api.Job{Name: j.Name, Dataset: j.Dataset, Seed: j.Seed, WorldSize: j.WorldSize, BatchSize: j.BatchSize,
		Ranks: j.Ranks, Version: j.Version}
	if p := j.Prev; p != nil {
		out.Previous = &api.JobGeneration{Generation: p.Version, WorldSize: p.WorldSize, Ranks: p.Ranks}
	}
	return out
}

// Datasets lists the datasets this node's catalog holds.
func (c *Control) Datasets() []api.Dataset {
	out := []api.Dataset{}
	for _, d := range c.cat.Datasets() {
		out = append(out, DatasetInfo(d))
	}
	return out
}

// HasDataset reports whether this node's catalog holds the dataset now.
func (c *Control) HasDataset(name string) bool { _, ok := c.cat.Dataset(name); return ok }

// HasJob reports whether this node's catalog holds the job now.
func (c *Control) HasJob(name string) bool { _, ok := c.cat.Job(name); return ok }

// Dataset finds a dataset, giving a follower a moment to catch up, and
// longer when the leader confirms the dataset exists.
func (c *Control) Dataset(ctx context.Context, name string) (*catalog.Dataset, error) {
	d, ok := c.cat.Dataset(name)
	if ok || c.cat.IsLeader() {
		if !ok {
			return nil, fmt.Errorf("%w: no dataset %q", catalog.ErrNotFound, name)
		}
		return d, nil
	}
	wait := followerGrace
	if c.leaderHasDataset(ctx, name) {
		wait = catchUpWait
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	c.cat.WaitFor(wctx, func() bool { d, ok = c.cat.Dataset(name); return ok })
	cancel()
	if !ok {
		return nil, fmt.Errorf("%w: no dataset %q", catalog.ErrNotFound, name)
	}
	return d, nil
}

// PutDataset registers a dataset (idempotent for the same source). It
// checks --allow-source here, before anything is relayed or listed, and
// registers on the leader. created is false when it already existed.
func (c *Control) PutDataset(ctx context.Context, name, spec string) (info api.Dataset, created bool, err error) {
	if _, err := c.CheckSource(spec); err != nil {
		return api.Dataset{}, false, err
	}
	return c.Leader().PutDataset(ctx, name, spec)
}

// RefreshDataset lists a registered dataset's source again, on the leader,
// and records it as a new version (a new ID: nothing cached of the old one is
// served for it; the quota kept; derived datasets dropped). changed is false
// when the source lists exactly as registered, and nothing is written.
// spec, when given, must be the registered source: a refresh never moves a
// dataset to other storage (delete it and register it again for that).
func (c *Control) RefreshDataset(ctx context.Context, name, spec string) (api.Dataset, bool, error) {
	if spec != "" {
		if _, err := c.CheckSource(spec); err != nil {
			return api.Dataset{}, false, err
		}
	}
	return c.Leader().RefreshDataset(ctx, name, spec)
}

// derivedQuota refuses a quota on a derived dataset (issue 46): its items are
// evicted before any parent item and never admitted by a quota's rules, so a
// quota there would be enforced yet shown nowhere and mean nothing a user
// could predict. The parent's quota is the one that bounds the memory.
func derivedQuota(d *catalog.Dataset) error {
	return fmt.Errorf("%w: %q is derived from %q: a quota applies to datasets read from a source; derived items are "+
		"evicted first (they can be recomputed), so set the quota on %q", ErrBadRequest, d.Name, d.DerivedFrom, d.DerivedFrom)
}

// SetQuota sets (or lifts) a dataset's quota on the leader, registering the
// dataset from source first when source is given; --allow-source is checked
// here, before anything is relayed. The caller checks the quota's bounds.
func (c *Control) SetQuota(ctx context.Context, name, source string, quota api.Quota) (api.Dataset, bool, error) {
	if d, ok := c.cat.Dataset(name); ok && d.Derived() && !quota.Lift { // refused here, not relayed; the leader checks again
		return api.Dataset{}, false, derivedQuota(d)
	}
	if source != "" {
		if _, err := c.CheckSource(source); err != nil {
			return api.Dataset{}, false, err
		}
	}
	return c.Leader().SetQuota(ctx, name, source, quota)
}

// PutGroup defines a coordinated-prep group on the leader and returns once
// this node's catalog holds it; created is false when it was defined so
// already.
func (c *Control) PutGroup(ctx context.Context, g catalog.Group) (*catalog.Group, bool, error) {
	return c.Leader().PutGroup(ctx, g)
}

// DeleteGroup ends a group (on the leader).
func (c *Control) DeleteGroup(ctx context.Context, name string) error {
	return c.Leader().DeleteGroup(ctx, name)
}

// DeleteDataset removes a dataset from the catalog (on the leader).
func (c *Control) DeleteDataset(ctx context.Context, name string) error {
	return c.Leader().DeleteDataset(ctx, name)
}

// Jobs lists the registered jobs.
func (c *Control) Jobs() []api.Job {
	out := []api.Job{}
	for _, j := range c.cat.Jobs() {
		out = append(out, jobInfo(j))
	}
	return out
}

// lookupJob finds a job, giving a follower a moment to catch up.
func (c *Control) lookupJob(ctx context.Context, name string) (*catalog.Job, bool) {
	j, ok := c.cat.Job(name)
	if !ok && !c.cat.IsLeader() {
		wctx, cancel := context.WithTimeout(ctx, followerGrace)
		c.cat.WaitFor(wctx, func() bool { j, ok = c.cat.Job(name); return ok })
		cancel()
	}
	return j, ok
}

// Job describes a registered job.
func (c *Control) Job(ctx context.Context, name string) (api.Job, error) {
	j, ok := c.lookupJob(ctx, name)
	if !ok {
		return api.Job{}, fmt.Errorf("%w: no job %q", catalog.ErrNotFound, name)
	}
	return jobInfo(j), nil
}

// PutJob registers or replaces a job after checking its layout; the leader
// checks that its dataset exists (this node may not have caught up).
func (c *Control) PutJob(ctx context.Context, j api.Job) (api.Job, error) {
	if err := j.Validate(); err != nil {
		return api.Job{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return c.Leader().PutJob(ctx, j)
}

// DeleteJob removes a job (on the leader).
func (c *Control) DeleteJob(ctx context.Context, name string) error {
	return c.Leader().DeleteJob(ctx, name)
}

// AppliedIndex is the raft index this node's catalog has applied; the
// leader sends it with every write (api.HeaderApplied).
func (c *Control) AppliedIndex() uint64 { return c.cat.AppliedIndex() }

// IsLeader reports whether this node is the raft leader.
func (c *Control) IsLeader() bool { return c.cat.IsLeader() }

// ResumedPlans is how many re-split plans this node keeps (at most
// MaxPlans): a diagnostic, and what tests check the bound with.
func (c *Control) ResumedPlans() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.resumed)
}
