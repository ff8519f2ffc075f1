package checkpoint

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"stallfree/catalog"
	"stallfree/source"
)

// backend is where committed steps are persisted.
type backend interface {
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	Open(ctx context.Context, key string) (io.ReadCloser, int64, error)
	String() string
}

func openBackend(spec string, s3 source.S3Config) (backend, error) {
	switch {
	case strings.HasPrefix(spec, "s3://"):
		b, err := source.OpenS3Objects(spec, s3)
		if err != nil {
			return nil, err
		}
		return s3Backend{S3: b, spec: spec}, nil
	case strings.HasPrefix(spec, "dir://"):
		root := strings.TrimPrefix(spec, "dir://")
		if !filepath.IsAbs(root) {
			return nil, fmt.Errorf("%q: want dir:///abs/path", spec)
		}
		if err := os.MkdirAll(root, 0o750); err != nil {
			return nil, err
		}
		return dirBackend{root: root}, nil
	}
	return nil, fmt.Errorf("%q: want dir:///abs/path or s3://bucket/prefix", spec)
}

// objectKey is where a part is persisted: NAME/STEP/PART (names are safe
// path segments, CheckName).
func objectKey(name string, step uint64, part string) string {
	return name + "/" + strconv.FormatUint(step, 10) + "/" + part
}

type s3Backend struct {
	*source.S3
	spec string
}

func (b s3Backend) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	return b.PutObject(ctx, key, r, size)
}
func (b s3Backend) Open(ctx context.Context, key string) (io.ReadCloser, int64, error) {
	return b.GetObject(ctx, key)
}
func (b s3Backend) String() string { return b.spec }

type dirBackend struct{ root string }

// Put writes a temporary file, syncs it and renames it into place, so a
// persisted part is whole or absent.
func (b dirBackend) Put(_ context.Context, key string, r io.Reader, size int64) error {
	path := filepath.Join(b.root, filepath.FromSlash(key))
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".part-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	n, err := io.Copy(f, r)
	if err == nil && n != size {
		err = fmt.Errorf("wrote %d of %d bytes", n, size)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("persist %s: %w", key, err)
	}
	return os.Rename(f.Name(), path)
}

func (b dirBackend) Open(_ context.Context, key string) (io.ReadCloser, int64, error) {
	f, err := os.Open(filepath.Join(b.root, filepath.FromSlash(key)))
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

func (b dirBackend) String() string { return "dir://" + b.root }

// leaderLoop runs, on whichever node leads raft, the work that changes
// commit state: persisting committed steps one at a time (retrying with
// backoff) and re-replicating parts whose holder stayed dead.
func (s *Service) leaderLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.Tick)
	defer t.Stop()
	var (
		backoff time.Duration
		nextTry time.Time
		repairs = newRepairState()
	)
	for {
		updated := s.cat.Updated()
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		case <-updated:
		}
		if !s.cat.IsLeader() {
			s.persistPending.Store(0)
			repairs = newRepairState()
			continue
		}
		s.repair(repairs)
		if s.persist == nil || time.Now().Before(nextTry) {
			continue
		}
		pending := s.unpersisted()
		s.persistPending.Store(int64(len(pending)))
		if len(pending) == 0 {
			continue
		}
		p := pending[0]
		if err := s.persistStep(p.name, p.step); err != nil {
			s.persistFailures.Add(1)
			s.setPersistErr(err.Error())
			backoff = min(max(2*backoff, s.cfg.Tick), 30*s.cfg.Tick)
			nextTry = time.Now().Add(backoff)
			s.log.Warn("checkpoint persist failed; retrying", "name", p.name, "step", p.step.Step, "retry_in", backoff, "err", err)
			continue
		}
		backoff, nextTry = 0, time.Time{}
		s.setPersistErr("")
		s.persisted.Add(1)
		s.persistPending.Store(int64(len(pending) - 1))
		s.log.Info("checkpoint persisted", "name", p.name, "step", p.step.Step, "to", s.persist.String())
	}
}

type pendingStep struct {
	name string
	step *catalog.CheckpointStep
}

// unpersisted lists committed steps not yet persisted, oldest commit first.
func (s *Service) unpersisted() []pendingStep {
	var out []pendingStep
	for _, ck := range s.cat.Checkpoints() {
		for _, st := range ck.Steps {
			if !st.Persisted {
				out = append(out, pendingStep{ck.Name, st})
			}
		}
	}
	slices.SortFunc(out, func(a, b pendingStep) int { return int(a.step.Version) - int(b.step.Version) })
	return out
}

// persistStep writes every part of a step (from any copy, checked) and then
// marks the step persisted through raft.
func (s *Service) persistStep(name string, st *catalog.CheckpointStep) error {
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Minute)
	defer cancel()
	for _, p := range st.Parts {
		r, err := s.openForCopy(ctx, name, st.Step, p.Name)
		if err != nil {
			return err
		}
		// A peer's copy is checked as it streams (openPeer); this node's is
		// hashed here, so what is persisted is the committed part, byte for
		// byte, or nothing (a backend keeps no partial object).
		var body io.Reader = r
		if r.From == "memory" {
			body = newVerifier(io.NopCloser(r), p.Size, p.Sum)
		}
		err = s.persist.Put(ctx, objectKey(name, st.Step, p.Name), body, p.Size)
		r.Close()
		if err != nil {
			return err
		}
	}
	return s.cat.MarkCheckpointPersisted(name, st.Step, st.Version)
}

// openForCopy opens a part from memory (here or a peer), never from the
// persisted store.
func (s *Service) openForCopy(ctx context.Context, name string, step uint64, part string) (*Part, error) {
	p, err := s.Open(ctx, name, step, part, false)
	if err != nil {
		return nil, err
	}
	if p.From == "persisted" {
		p.Close()
		return nil, fmt.Errorf("%w: no copy of %s step %d part %s in memory", ErrUnavailable, name, step, part)
	}
	return p, nil
}

// cleanLoop frees parts nobody needs any more: parts of checkpoints
// deleted, of steps the catalog dropped (beyond --checkpoint-keep) and of
// uploads older than the newest committed step that never committed.
func (s *Service) cleanLoop() {
	defer s.wg.Done()
	known := map[string]bool{}
	for {
		updated := s.cat.Updated()
		select {
		case <-s.ctx.Done():
			return
		case <-updated:
		}
		s.steps.note(s, time.Now()) // a commit's age counts from here
		now := map[string]*catalog.Checkpoint{}
		for _, ck := range s.cat.Checkpoints() {
			now[ck.Name] = ck
			known[ck.Name] = true
		}
		n := s.mem.drop(func(k partKey) bool {
			ck, ok := now[k.name]
			if !ok {
				return known[k.name] // deleted since this node saw it
			}
			if _, committed := ck.Step(k.step); committed {
				return false
			}
			return k.step <= ck.Latest().Step
		})
		for name := range known {
			if now[name] == nil {
				delete(known, name)
			}
		}
		if n > 0 {
			s.log.Debug("checkpoint parts freed", "parts", n)
		}
	}
}
