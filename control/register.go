package control

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/source"
)

// registerDataset lists the source and records the dataset in the catalog.
// It runs on the raft leader (localLeader).
func (c *Control) registerDataset(ctx context.Context, name, spec string) (_ *catalog.Dataset, _ bool, err error) {
	norm, err := c.CheckSource(spec)
	if err != nil {
		return nil, false, err
	}
	if d, ok := c.cat.Dataset(name); ok {
		if d.Source == norm {
			return d, false, nil
		}
		return nil, false, fmt.Errorf("%w: dataset %q is registered with source %s", catalog.ErrConflict, name, d.Source)
	}
	entries, leftOut, err := c.listSource(ctx, name, norm)
	if err != nil {
		return nil, false, err
	}
	return c.cat.RegisterDataset(name, norm, entries, leftOut)
}

// listSource lists a dataset's source (normalized) for its registration,
// visible at GET .../registration while it runs.
func (c *Control) listSource(ctx context.Context, name, norm string) (_ []source.Entry, leftOut int, err error) {
	if !c.startListing() {
		return nil, 0, &api.Error{Status: http.StatusServiceUnavailable, Retry: true,
			Message: fmt.Sprintf("%d source listings are running on the raft leader: register again in a moment", maxListings)}
	}
	defer c.endListing()
	reg := c.startRegistration(name)
	defer func() { reg.end(err) }()
	src, err := source.Open(norm, source.Options{S3: c.cfg.S3, Progress: &reg.progress})
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	defer src.Close()
	if err := c.AllowedOpened(norm, src); err != nil {
		return nil, 0, err
	}
	entries, err := src.List(ctx)
	if err != nil {
		if storageFault(err) {
			return nil, 0, err // 403, 404 or 502 as storage said
		}
		return nil, 0, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if len(entries) > 1<<31 {
		return nil, 0, fmt.Errorf("%w: %d items is more than one dataset may hold", ErrBadRequest, len(entries))
	}
	if l, ok := src.(interface{ LeftOut() int }); ok { // tar members, S3 objects
		leftOut = l.LeftOut()
	}
	return entries, leftOut, nil
}

// refreshDataset lists a registered dataset's source again and records the
// listing as a new version, unless it is exactly the registered one (every
// key, size and fingerprint alike: changed is false, nothing is written).
// It runs on the raft leader (localLeader). A refresh that another one
// overtook (the name moved to a newer version while this one listed) lists
// again against that version, a few times; one whose dataset was deleted
// meanwhile is not found, and records nothing.
func (c *Control) refreshDataset(ctx context.Context, name, spec string) (d *catalog.Dataset, changed bool, err error) {
	for range refreshTries {
		d, changed, err = c.refreshOnce(ctx, name, spec)
		if !errors.Is(err, catalog.ErrMoved) {
			return d, changed, err
		}
	}
	return nil, false, fmt.Errorf("%w: dataset %q was refreshed by other requests while its source was listed, %d times; refresh again",
		catalog.ErrConflict, name, refreshTries)
}

// refreshTries bounds how often a refresh lists again after being
// overtaken: concurrent refreshes of one name end after one more listing
// (the registration lock orders them), so more means a stream of them.
const refreshTries = 3

func (c *Control) refreshOnce(ctx context.Context, name, spec string) (_ *catalog.Dataset, changed bool, err error) {
	d, ok := c.cat.Dataset(name)
	if !ok {
		return nil, false, fmt.Errorf("%w: no dataset %q", catalog.ErrNotFound, name)
	}
	if spec != "" {
		norm, err := c.CheckSource(spec)
		if err != nil {
			return nil, false, err
		}
		if norm != d.Source {
			return nil, false, fmt.Errorf("%w: dataset %q is registered with source %s (a refresh lists that one again)",
				catalog.ErrConflict, name, d.Source)
		}
	}
	if d.Derived() {
		return nil, false, fmt.Errorf("%w: %q is derived from %s: loaders write its items, there is no source to list again (refresh %s)",
			ErrBadRequest, name, d.DerivedFrom, d.DerivedFrom)
	}
	if err := c.Allowed(d.Source); err != nil {
		return nil, false, err
	}
	entries, leftOut, err := c.listSource(ctx, name, d.Source)
	if err != nil {
		return nil, false, err
	}
	if sameListing(d.Manifest, entries) {
		return d, false, nil
	}
	nd, err := c.cat.RefreshDataset(name, d.Source, d.Version, entries, leftOut)
	return nd, err == nil, err
}

// sameListing reports whether entries are m's, line for line.
func sameListing(m *catalog.Manifest, entries []source.Entry) bool {
	if m.Len() != len(entries) {
		return false
	}
	for i, e := range entries {
		if m.Entry(i) != e {
			return false
		}
	}
	return true
}

// storageFault reports whether err is storage's answer rather than a fault
// in the request: the API passes it on with its own status.
func storageFault(err error) bool {
	return errors.Is(err, source.ErrDenied) || errors.Is(err, source.ErrNotFound) ||
		errors.Is(err, source.ErrUnavailable) || errors.Is(err, source.ErrTimeout) || errors.Is(err, context.DeadlineExceeded)
}

// ErrDatasetFlag marks a --dataset flag that cannot register as given: its
// source cannot be listed, is not allowed, or another source holds the
// name. A node stops at start on it, as on any other bad flag.
var ErrDatasetFlag = errors.New("cannot register as given")

// RegisterAtStart registers --dataset flags once the catalog has a leader.
// Followers leave registration to the leader's own flags or to cachectl.
func (c *Control) RegisterAtStart(ctx context.Context, specs []string) error {
	for _, spec := range specs {
		name, src, ok := strings.Cut(spec, "=")
		if !ok || name == "" || src == "" {
			return fmt.Errorf("--dataset %q: want NAME=SOURCE", spec)
		}
		for {
			if err := c.cat.WaitLeader(ctx); err != nil {
				return err
			}
			if !c.cat.IsLeader() {
				if _, ok := c.cat.Dataset(name); ok {
					break
				}
				if c.cat.Leader() != c.cfg.Name { // raft may name this node a moment before it leads
					return fmt.Errorf("--dataset %s: this node is not the raft leader; register on the leader (%s)", name, c.cat.Leader())
				}
			}
			d, created, err := c.registerDataset(ctx, name, src)
			if e, busy := errors.AsType[*api.Error](err); errors.Is(err, catalog.ErrNoLeader) || errors.Is(err, catalog.ErrNotLeader) ||
				busy && e.Retry {
				select { // leadership is settling, or listings are running at their bound
				case <-ctx.Done():
					if errors.Is(ctx.Err(), context.DeadlineExceeded) {
						return fmt.Errorf("--dataset %s: %w: not registered within the start's deadline: %w", name, ErrDatasetFlag, err)
					}
					return fmt.Errorf("--dataset %s: %w", name, err)
				case <-time.After(20 * time.Millisecond):
				}
				continue
			}
			if err != nil && ctx.Err() == nil {
				// The source, the allow-list or the catalog refused this
				// flag: waiting will not change that.
				return fmt.Errorf("--dataset %s: %w: %w", name, ErrDatasetFlag, err)
			}
			if err != nil && errors.Is(ctx.Err(), context.DeadlineExceeded) {
				// Not listed within the start's deadline: a node left up
				// would never be ready, and nothing would try again.
				return fmt.Errorf("--dataset %s: %w: not registered within the start's deadline: %w", name, ErrDatasetFlag, err)
			}
			if err != nil {
				return fmt.Errorf("--dataset %s: %w", name, err)
			}
			c.log.Info("dataset", "name", name, "source", d.Source, "items", d.Manifest.Len(), "created", created)
			break
		}
	}
	return nil
}

// registration is one listing of a dataset's source, watched by
// `cachectl datasets add` while the registration request runs.
type registration struct {
	progress source.Progress
	start    time.Time
	mu       sync.Mutex
	took     time.Duration // set when it ended
	ended    bool
	err      string
}

// Bounds of what a node keeps of the listings it ran, which any token
// holder starts by asking to register a name: every failed one was kept
// with its whole error (which quotes the source) for as long as the node
// ran, and 300 requests with 1 MiB sources held a gigabyte.
const (
	maxRegistrations = 1024 // names; past it the oldest finished listing is forgotten
	maxRegErrorLen   = 1024 // bytes of a listing's error kept
)

// maxListings bounds the source listings that run at once on this node
// (the leader: every registration and refresh is listed there). A listing
// holds every key it has listed (hundreds of bytes each) until it ends;
// beyond the bound a registration answers 503 and Retry-After, which the
// clients follow.
const maxListings = 2

func (c *Control) startListing() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.listing >= maxListings {
		return false
	}
	c.listing++
	return true
}

func (c *Control) endListing() {
	c.mu.Lock()
	c.listing--
	c.mu.Unlock()
}

func (c *Control) startRegistration(name string) *registration {
	r := &registration{start: time.Now()}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, again := c.registrations[name]; !again && len(c.registrations) >= maxRegistrations {
		c.forgetOldestRegistration()
	}
	c.registrations[name] = r
	return r
}

// forgetOldestRegistration drops the finished listing that started first
// (none while all are running: those are bounded by the requests running).
// Caller holds c.mu.
func (c *Control) forgetOldestRegistration() {
	oldest, at := "", time.Time{}
	for name, r := range c.registrations {
		r.mu.Lock()
		ended, start := r.ended, r.start
		r.mu.Unlock()
		if ended && (oldest == "" || start.Before(at)) {
			oldest, at = name, start
		}
	}
	if oldest != "" {
		delete(c.registrations, oldest)
	}
}

func (r *registration) end(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended, r.took = true, time.Since(r.start)
	if err != nil {
		r.err = err.Error()
		if len(r.err) > maxRegErrorLen {
			r.err = strings.ToValidUTF8(r.err[:maxRegErrorLen], "") + "…"
		}
	}
}

// Registration reports the last listing this node ran for a dataset; false
// when it ran none since it started.
func (c *Control) Registration(name string) (api.Registration, bool) {
	c.mu.Lock()
	r, ok := c.registrations[name]
	c.mu.Unlock()
	if !ok {
		return api.Registration{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	took := r.took
	if !r.ended {
		took = time.Since(r.start)
	}
	p := &r.progress
	return api.Registration{Running: !r.ended, Listed: p.Listed.Load(), Shards: p.Shards.Load(), ShardsDone: p.ShardsDone.Load(),
		ShardBytes: p.ShardBytes.Load(), Seconds: took.Seconds(), Error: r.err}, true
}
