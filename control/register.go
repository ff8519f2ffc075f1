package control

import (
	"context"
	"errors"
	"fmt"
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
	reg := c.startRegistration(name)
	defer func() { reg.end(err) }()
	src, err := source.Open(norm, source.Options{S3: c.cfg.S3, Progress: &reg.progress})
	if err != nil {
		return nil, false, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	defer src.Close()
	entries, err := src.List(ctx)
	if err != nil {
		if storageFault(err) {
			return nil, false, err // 403, 404 or 502 as storage said
		}
		return nil, false, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if len(entries) > 1<<31 {
		return nil, false, fmt.Errorf("%w: %d items is more than one dataset may hold", ErrBadRequest, len(entries))
	}
	leftOut := 0
	if t, ok := src.(*source.Tar); ok {
		leftOut = t.LeftOut()
	}
	return c.cat.RegisterDataset(name, norm, entries, leftOut)
}

// storageFault reports whether err is storage's answer rather than a fault
// in the request: the API passes it on with its own status.
func storageFault(err error) bool {
	return errors.Is(err, source.ErrDenied) || errors.Is(err, source.ErrNotFound) ||
		errors.Is(err, source.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded)
}

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
			if errors.Is(err, catalog.ErrNoLeader) || errors.Is(err, catalog.ErrNotLeader) {
				select { // leadership is settling
				case <-ctx.Done():
					return fmt.Errorf("--dataset %s: %w", name, err)
				case <-time.After(20 * time.Millisecond):
				}
				continue
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

func (c *Control) startRegistration(name string) *registration {
	r := &registration{start: time.Now()}
	c.mu.Lock()
	c.registrations[name] = r
	c.mu.Unlock()
	return r
}

func (r *registration) end(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended, r.took = true, time.Since(r.start)
	if err != nil {
		r.err = err.Error()
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
