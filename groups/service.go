package groups

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/handoff"
	"stallfree/relay"
)

// Errors beyond the catalog's (catalog.ErrNotFound: 404, ErrConflict: 409);
// httpapi maps each to its status.
var (
	// ErrBadRequest: a malformed request (400).
	ErrBadRequest = errors.New("bad request")
	// ErrDetached: the job is detached from its group (410).
	ErrDetached = errors.New("detached")
	// ErrNotStaged: the batch is not staged (404 once the wait is over).
	ErrNotStaged = errors.New("not staged")
	// ErrFull: the group's staging bound or the node's memory stayed full
	// for the whole wait (503).
	ErrFull = errors.New("staging full")
	// ErrTooLarge: a batch over --max-item-bytes (413).
	ErrTooLarge = errors.New("batch too large")
	// ErrStale: a read named a version of the group's definition that is
	// not the owner's (a host copy of a batch from before a redefinition).
	ErrStale = errors.New("stale group version")
)

// maxEpoch bounds epochs in requests, as for jobs.
const maxEpoch = 1 << 20

// Host is the node as groups sees it.
type Host interface {
	Name() string
	// Group and Groups read the local catalog replica.
	Group(name string) (*catalog.Group, bool)
	Groups() []*catalog.Group
	// AwaitCatalog waits until cond holds on the local catalog, or the
	// catalog has caught up with the leader, or ctx ends.
	AwaitCatalog(ctx context.Context, cond func() bool) bool
	// AppliedIndex is the raft index the local catalog has applied;
	// AwaitApplied waits until it reaches idx or ctx ends.
	AppliedIndex() uint64
	AwaitApplied(ctx context.Context, idx uint64) bool
	// PutGroup and DeleteGroup write through the raft leader and return once
	// this node's catalog shows the write.
	// created is false when the group was defined so already.
	PutGroup(ctx context.Context, g catalog.Group) (_ *catalog.Group, created bool, _ error)
	DeleteGroup(ctx context.Context, name string) error
	// GroupOwner is the member staging a group's batches: its HTTP address,
	// and whether it is this node.
	GroupOwner(group string) (addr string, self bool)
	// ClaimMemory charges staged bytes against --memory (false: no room);
	// UnclaimMemory gives them back.
	ClaimMemory(n uint64) bool
	UnclaimMemory(n uint64)
}

// Config of the group service.
type Config struct {
	// Timeout detaches a job that made no request for this long
	// (--group-timeout; 0: 30 s).
	Timeout time.Duration
	// MaxBatchBytes bounds one staged batch (--max-item-bytes).
	MaxBatchBytes int
	// Relay is the node's client to the other members' APIs, through which
	// this node asks a group's owner about it.
	Relay  *relay.Client
	Logger *slog.Logger
	// ShmDir, when set, is a directory in shared memory (a tmpfs such as
	// /dev/shm) where staged batches are kept as files that jobs on this
	// host map (shm.go). "": batches are kept in the heap.
	ShmDir string
	// Linger is how long a dropped batch's file stays (0: DefaultLinger).
	Linger time.Duration
	// MaxHostCopyBytes bounds the relayed batches kept for this host's
	// jobs (hostcopy.go; 0: DefaultMaxHostCopyBytes).
	MaxHostCopyBytes int64
	// ShmTag tells this node's files from those of another node of the same
	// name on this host (cachenode: a digest of its data directory).
	ShmTag string
}

// Service serves groups on one node: definitions for every group, and the
// staging of the groups this node owns. Safe for concurrent use.
type Service struct {
	host Host
	cfg  Config

	mu     sync.Mutex
	stages map[string]*stage
	linger []lingering // files of dropped batches, removed when due (shm.go)
	// copies are batches relayed from owners on other hosts (hostcopy.go).
	copies    map[copyKey]hostCopy
	copyBytes int64
	// copyOrder is the copies in the order they were kept, which is the
	// order they expire in (one life for all): eviction and expiry take
	// from its front. An entry whose copy is gone or newer (seq) is skipped.
	copyOrder []copyEntry
	copySeq   uint64
	copyHits  atomic.Uint64

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New starts the service's clock (the group timeout); Close stops it.
func New(host Host, cfg Config) *Service {
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Linger <= 0 {
		cfg.Linger = DefaultLinger
	}
	if cfg.MaxHostCopyBytes <= 0 {
		cfg.MaxHostCopyBytes = DefaultMaxHostCopyBytes
	}
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{host: host, cfg: cfg, stages: map[string]*stage{}, cancel: cancel, copies: map[copyKey]hostCopy{}}
	if cfg.ShmDir != "" {
		s.removeStaleShm()
	}
	s.wg.Add(1)
	go s.clock(ctx)
	return s
}

// Close stops the clock and frees every staged batch.
func (s *Service) Close() {
	s.cancel()
	s.wg.Wait()
	s.mu.Lock()
	defer s.mu.Unlock()
	for name, st := range s.stages {
		s.release(name, st)
	}
	s.expireCopies(time.Time{})
	s.removeDue(time.Time{})
}

// Owner is where a group's batches are staged.
func (s *Service) Owner(group string) (addr string, self bool) { return s.host.GroupOwner(group) }

// Version is the version of the group's definition in this node's catalog
// (false: the catalog does not show the group).
func (s *Service) Version(group string) (uint64, bool) {
	g, ok := s.host.Group(group)
	if !ok {
		return 0, false
	}
	return g.Version, true
}

// MaxBatchBytes is the largest batch a PUT may carry.
func (s *Service) MaxBatchBytes() int { return s.cfg.MaxBatchBytes }

// clock detaches jobs silent for longer than the timeout, and frees the
// stages of groups that were deleted or redefined.
func (s *Service) clock(ctx context.Context) {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.tickEvery())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.tick(time.Now())
	}
}

// tickEvery is the clock's period: a fraction of the timeout, and often
// enough to remove a dropped batch's file about when its linger ends, not up
// to a second later (its memory is what the next batches reuse).
func (c Config) tickEvery() time.Duration {
	return max(min(c.Timeout/8, c.Linger/2, time.Second), 10*time.Millisecond)
}

func (s *Service) tick(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireCopies(now)
	s.removeDue(now)
	for name, st := range s.stages {
		if g, ok := s.host.Group(name); !ok || g.Version != st.spec.Version {
			s.release(name, st)
			continue
		}
		for j := range st.jobs {
			js := &st.jobs[j]
			if !js.detached && js.inflight == 0 && now.Sub(js.last) > s.cfg.Timeout {
				st.detach(j, fmt.Sprintf("no request for %v", s.cfg.Timeout))
			}
		}
		s.sweep(st)
	}
}

// sweep drops what every attached job has (after a detachment) and gives
// its memory back. Caller holds s.mu.
func (s *Service) sweep(st *stage) {
	if freed := st.sweep(); freed > 0 {
		s.host.UnclaimMemory(freed)
	}
}

// release drops a stage and everything staged in it; waiters see the group
// gone. Caller holds s.mu.
func (s *Service) release(name string, st *stage) {
	s.host.UnclaimMemory(st.bytes)
	for _, b := range st.staged {
		s.retire(b)
	}
	st.staged, st.bytes = map[uint64]*batch{}, 0
	delete(s.stages, name)
	st.notify()
}

// catalogGrace bounds how long a request naming a group this node's catalog
// does not show waits for the catalog to catch up with the leader: the group
// may have been defined through another node a moment ago, and raft brings
// it here a moment later (seconds, on a loaded machine).
const catalogGrace = 15 * time.Second

// awaitGroup gives the local catalog a moment to learn of a group: first
// everything the asking node had applied (after: the raft index a relaying
// node sent, 0 for a client), then whatever this node knows the leader
// committed.
func (s *Service) awaitGroup(ctx context.Context, name string, after uint64) {
	if _, ok := s.host.Group(name); ok {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, catalogGrace)
	defer cancel()
	if after > 0 {
		s.host.AwaitApplied(ctx, after)
	}
	s.host.AwaitCatalog(ctx, func() bool { _, ok := s.host.Group(name); return ok })
}

// stageOf returns the group's stage here, made on first use, and the
// catalog's definition. Caller holds s.mu.
func (s *Service) stageOf(name string) (*stage, error) {
	g, st, err := s.currentStage(name)
	if err != nil || st != nil {
		return st, err
	}
	st = newStage(g, time.Now())
	st.retire = s.retire
	s.stages[name] = st
	return st, nil
}

// currentStage returns the catalog's definition of group name and its stage
// here, nil when none has been made yet for that definition (a stage of an
// earlier one is released: its batches go now). It makes nothing: asking
// about a group or saying a job lives must not start the group's clock.
// Caller holds s.mu.
func (s *Service) currentStage(name string) (*catalog.Group, *stage, error) {
	g, ok := s.host.Group(name)
	if !ok {
		return nil, nil, fmt.Errorf("%w: group %q", catalog.ErrNotFound, name)
	}
	st, ok := s.stages[name]
	if !ok {
		return g, nil, nil
	}
	if st.spec.Version != g.Version {
		s.release(name, st) // a redefinition
		return g, nil, nil
	}
	return g, st, nil
}

// Put defines group name (PUT /v1/groups/{g}). The same definition again
// changes nothing (created false); a different one is refused while any job
// is attached.
func (s *Service) Put(ctx context.Context, name string, spec api.GroupSpec) (info api.GroupInfo, created bool, err error) {
	if err := spec.Validate(); err != nil {
		return info, false, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	want := catalog.Group{Name: name, Dataset: spec.Dataset, Seed: spec.Seed, BatchSize: spec.BatchSize,
		Jobs: spec.Jobs, Window: *spec.Window}
	if old, ok := s.host.Group(name); ok && old.SameSpec(&want) {
		info, err := s.Info(ctx, name, 0)
		return info, false, err
	}
	// Whether the dataset exists is the catalog's to say (on the leader): this
	// node's replica may not have applied it yet.
	if _, ok := s.host.Group(name); ok {
		cur, err := s.Info(ctx, name, 0)
		if err != nil {
			return info, false, err
		}
		for _, j := range cur.Jobs {
			if j.Seen && !j.Detached {
				return info, false, fmt.Errorf("%w: group %q is defined otherwise and job %d is attached; delete it first or wait until its jobs are done",
					catalog.ErrConflict, name, j.Job)
			}
		}
	}
	_, created, err = s.host.PutGroup(ctx, want)
	if err != nil {
		return info, false, err
	}
	info, err = s.Info(ctx, name, 0)
	return info, created, err
}

// Delete ends a group; its owner frees what is staged on its next tick.
func (s *Service) Delete(ctx context.Context, name string) error {
	if _, ok := s.host.Group(name); !ok {
		return fmt.Errorf("%w: group %q", catalog.ErrNotFound, name)
	}
	return s.host.DeleteGroup(ctx, name)
}

// List is every group's definition, by name, with its jobs as not seen: the
// jobs' state lives at each group's owner (Info).
func (s *Service) List() []api.GroupInfo {
	out := []api.GroupInfo{}
	for _, g := range s.host.Groups() {
		out = append(out, newStage(g, time.Time{}).info(g.Name, ""))
	}
	return out
}

// Info is GET /v1/groups/{g}: the owner's view, asked of the owner when this
// node is not it, so every node answers alike.
// after is the raft index a relaying node had applied (0: none).
func (s *Service) Info(ctx context.Context, name string, after uint64) (api.GroupInfo, error) {
	if addr, self := s.host.GroupOwner(name); !self && after == 0 {
		return s.remoteInfo(ctx, addr, name)
	}
	s.awaitGroup(ctx, name, after)
	return s.LocalInfo(name)
}

// LocalInfo is this node's view of a group it owns. Asking starts nothing:
// a group's stage, and with it the clock that detaches a silent job, starts
// at its first batch request. A loader defines its group and asks for it
// when it is made, and a training job then builds its model, which may take
// longer than --group-timeout, before it reads a batch; had this made the
// stage, every job would be detached before any batch was shared.
func (s *Service) LocalInfo(name string) (api.GroupInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, st, err := s.currentStage(name)
	if err != nil {
		return api.GroupInfo{}, err
	}
	if st == nil {
		st = newStage(g, time.Time{})
	}
	info := st.info(name, s.host.Name())
	info.TimeoutS = s.cfg.Timeout.Seconds()
	return info, nil
}

// Alive is POST /v1/groups/{g}/jobs/{j}/alive at the group's owner: job j's
// process is alive, though it asks for no batch now (between epochs, in a
// validation pass). A loader says so every third of the timeout, so that a
// silent job is one whose process stopped or died, and a pause that every
// job takes together (longer than the timeout) detaches none of them. A job
// that falls W batches behind is still detached by the window. Before the
// group's first batch request there is no clock to hold back, and nothing
// is made; a detached job is told so (ErrDetached).
func (s *Service) Alive(name string, job int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	g, st, err := s.currentStage(name)
	if err != nil {
		return err
	}
	if job < 0 || job >= g.Jobs {
		return fmt.Errorf("%w: job %d of group %q (jobs 0..%d)", ErrBadRequest, job, name, g.Jobs-1)
	}
	if st == nil {
		return nil
	}
	js := &st.jobs[job]
	if js.detached {
		return fmt.Errorf("%w: job %d of group %q: %s; prepare every batch yourself", ErrDetached, job, name, js.why)
	}
	js.last = time.Now()
	return nil
}

func (s *Service) remoteInfo(ctx context.Context, addr, name string) (api.GroupInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	// What this node has applied: the owner waits for it before it says a
	// group defined through this node does not exist.
	h := http.Header{api.HeaderApplied: {strconv.FormatUint(s.host.AppliedIndex(), 10)}}
	var info api.GroupInfo
	_, err := s.cfg.Relay.JSON(ctx, http.MethodGet, addr, "/v1/groups/"+url.PathEscape(name), nil, &info, h, 1<<20)
	if e, ok := errors.AsType[*api.Error](err); ok {
		return info, e
	}
	if err != nil {
		return info, &api.Error{Status: http.StatusServiceUnavailable, Message: fmt.Sprintf("group %q: its owner at %s: %v", name, addr, err)}
	}
	return info, nil
}

// Batch names one batch of a group as a job asks for it.
type Batch struct {
	Group string
	Job   int
	Epoch uint64
	Index int
	// After is the raft index the node that relayed the request had
	// applied (0: not relayed): the group it names is waited for that long.
	After uint64
	// Version, when not 0, is the definition the reader holds a batch of
	// (a host copy): any other is refused (ErrStale) before the read counts.
	Version uint64
}

// position checks the request against the group and returns the batch's
// position. Caller holds s.mu.
func (b Batch) position(st *stage) (uint64, error) {
	if b.Job < 0 || b.Job >= st.spec.Jobs {
		return 0, fmt.Errorf("%w: job %d: group %q has jobs 0..%d (query parameter job)", ErrBadRequest, b.Job, b.Group, st.spec.Jobs-1)
	}
	if b.Epoch > maxEpoch {
		return 0, fmt.Errorf("%w: epoch %d out of range", ErrBadRequest, b.Epoch)
	}
	if nb := st.spec.Batches(); b.Index < 0 || b.Index >= nb {
		return 0, fmt.Errorf("%w: batch %d: an epoch of group %q has batches 0..%d", ErrBadRequest, b.Index, b.Group, nb-1)
	}
	if st.jobs[b.Job].detached {
		return 0, fmt.Errorf("%w: job %d of group %q: %s; prepare every batch yourself", ErrDetached, b.Job, b.Group, st.jobs[b.Job].why)
	}
	return b.Epoch*uint64(st.spec.Batches()) + uint64(b.Index), nil
}

// begin marks a request of a job in flight (a waiting job is alive); the
// returned func ends it.
func (s *Service) begin(st *stage, j int) func() {
	st.jobs[j].inflight++
	return func() {
		st.jobs[j].inflight--
		st.jobs[j].last = time.Now()
	}
}

// Get returns a staged batch, waiting up to wait for it. A job that is
// itself the batch's producer is answered at once (ErrNotStaged): it, not
// the stage, has to make the batch. producer is the job preparing the batch
// (by the rule in Producer) when the answer is ErrNotStaged.
func (s *Service) Get(ctx context.Context, b Batch, wait time.Duration) (data []byte, producer int, err error) {
	st, producer, err := s.GetStaged(ctx, b, wait)
	if err != nil {
		return nil, producer, err
	}
	if data, err = st.Bytes(); errors.Is(err, ErrGone) {
		producer = -1 // dropped meanwhile: the asker makes it
	}
	return data, producer, err
}

// GetStaged is Get, answering with the staged batch's file where it has one
// (shm.go) rather than its bytes.
func (s *Service) GetStaged(ctx context.Context, b Batch, wait time.Duration) (_ Staged, producer int, err error) {
	s.awaitGroup(ctx, b.Group, b.After)
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.stageOf(b.Group)
	if err != nil {
		return Staged{}, -1, err
	}
	if b.Version != 0 && b.Version != st.spec.Version {
		return Staged{}, -1, fmt.Errorf("%w: group %q is at version %d here, not %d", ErrStale, b.Group, st.spec.Version, b.Version)
	}
	pos, err := b.position(st)
	if err != nil {
		return Staged{}, -1, err
	}
	// A reader is never more than W batches past what is staged.
	if err := st.reach(b.Job, b.Epoch, pos, uint64(st.spec.Window)); err != nil {
		return Staged{}, -1, err
	}
	defer s.begin(st, b.Job)()
	st.touch(b.Job, pos)
	s.sweep(st)
	for {
		if st.jobs[b.Job].detached {
			_, err := b.position(st)
			return Staged{}, -1, err
		}
		if bt, ok := st.staged[pos]; ok {
			if !bt.has[b.Job] {
				bt.has[b.Job] = true
				st.jobs[b.Job].served++
			}
			got := Staged{Data: bt.data, Path: bt.path, Size: int64(bt.len()), Ino: bt.ino, Dev: bt.dev, Version: st.spec.Version}
			if st.complete(bt) {
				s.host.UnclaimMemory(st.drop(pos, bt))
			}
			return got, b.Job, nil
		}
		p := st.producer(pos)
		if _, done := st.done[pos]; done {
			return Staged{}, -1, fmt.Errorf("%w: batch %d of epoch %d of group %q was served to every attached job and dropped", ErrNotStaged, b.Index, b.Epoch, b.Group)
		}
		if p == b.Job {
			return Staged{}, p, fmt.Errorf("%w: batch %d of epoch %d of group %q is not staged; job %d (the asker) prepares it", ErrNotStaged, b.Index, b.Epoch, b.Group, p)
		}
		if !s.await(ctx, st) {
			return Staged{}, p, fmt.Errorf("%w: batch %d of epoch %d of group %q is not staged (waited %v; job %d prepares it)", ErrNotStaged, b.Index, b.Epoch, b.Group, wait, p)
		}
		if cur, ok := s.stages[b.Group]; !ok || cur != st {
			return Staged{}, -1, fmt.Errorf("%w: group %q was deleted or redefined", catalog.ErrNotFound, b.Group)
		}
	}
}

// await waits, with s.mu released, until the stage changes or ctx ends; it
// reports whether the stage changed.
func (s *Service) await(ctx context.Context, st *stage) bool {
	ch := st.changed
	s.mu.Unlock()
	defer s.mu.Lock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// Put stages a batch (PUT .../batches/{b}). The same bytes again are fine;
// other bytes are ErrConflict and the first stay. Past the group's bound
// (W × J × batch bytes) or the node's memory the producer waits up to wait,
// then gets ErrFull. created reports whether these bytes were staged now.
func (s *Service) PutBatch(ctx context.Context, b Batch, data []byte, wait time.Duration) (created bool, err error) {
	return s.put(ctx, b, incoming{data: data}, wait)
}

// PutHandedOver stages a batch its producer, a job on this host, wrote into
// a file of its own and handed over (package handoff): the file becomes the
// batch's shared-memory file, and the node writes nothing. The service owns
// the file from then on: it is closed when the batch retires, or at once
// when these bytes are not staged (an error, a batch there already).
func (s *Service) PutHandedOver(ctx context.Context, b Batch, f *handoff.File, wait time.Duration) (created bool, err error) {
	return s.put(ctx, b, incoming{file: f}, wait)
}

// incoming is a batch a producer sends: its bytes, or a handed-over file.
type incoming struct {
	data []byte
	file *handoff.File
}

func (in incoming) size() int {
	if in.file != nil {
		return int(in.file.Size)
	}
	return len(in.data)
}

// bytes are the batch's bytes; a handed-over file is read only when they
// must be compared (a batch staged already).
func (in incoming) bytes() ([]byte, error) {
	if in.file != nil {
		return in.file.ReadAll()
	}
	return in.data, nil
}

func (s *Service) put(ctx context.Context, b Batch, in incoming, wait time.Duration) (created bool, err error) {
	if in.file != nil {
		defer func() {
			if !created {
				in.file.Close()
			}
		}()
	}
	if s.cfg.MaxBatchBytes > 0 && in.size() > s.cfg.MaxBatchBytes {
		return false, fmt.Errorf("%w: %d bytes; --max-item-bytes is %d", ErrTooLarge, in.size(), s.cfg.MaxBatchBytes)
	}
	s.awaitGroup(ctx, b.Group, b.After)
	// In shared memory the batch is written to its file before the lock is
	// taken (a write of megabytes must not hold up the group), and the file
	// is removed unless the batch is staged from it. A handed-over file is
	// that file already.
	var shm string
	if in.file != nil {
		shm = in.file.Path
	} else if s.cfg.ShmDir != "" {
		nb := uint64(1) // the file's name only; the position is checked below
		if g, ok := s.host.Group(b.Group); ok {
			nb = uint64(max(g.Batches(), 1))
		}
		if shm, err = s.writeShm(b.Group, b.Epoch*nb+uint64(max(b.Index, 0)), in.data); err != nil {
			s.cfg.Logger.Warn("staging in shared memory failed; keeping the batch in the heap", "dir", s.cfg.ShmDir, "err", err)
			shm = ""
		}
		defer func() {
			if shm != "" && !created {
				os.Remove(shm)
			}
		}()
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	st, err := s.stageOf(b.Group)
	if err != nil {
		return false, err
	}
	pos, err := b.position(st)
	if err != nil {
		return false, err
	}
	// Producers take turns, so one may be up to W×J batches ahead (the
	// staging bound's reach).
	if err := st.reach(b.Job, b.Epoch, pos, uint64(st.spec.Window)*uint64(st.spec.Jobs)); err != nil {
		return false, err
	}
	defer s.begin(st, b.Job)()
	// The job's position moves only once its batch is in: a PUT refused
	// (409 aside: the batch is there) changes nothing.
	defer func() {
		if err == nil || errors.Is(err, catalog.ErrConflict) {
			st.touch(b.Job, pos)
			s.sweep(st)
		}
	}()
	n := uint64(in.size())
	for {
		if st.jobs[b.Job].detached {
			_, err := b.position(st)
			return false, err
		}
		if staged, same := st.sameBytes(pos, in.bytes); staged {
			st.putDone(b.Job, pos)
			if !same {
				return false, fmt.Errorf("%w: batch %d of epoch %d of group %q is staged with other bytes; they stay (read them)", catalog.ErrConflict, b.Index, b.Epoch, b.Group)
			}
			bt := st.staged[pos]
			bt.has[b.Job] = true
			if st.complete(bt) {
				s.host.UnclaimMemory(st.drop(pos, bt))
			}
			return false, nil
		}
		if _, done := st.done[pos]; done {
			st.putDone(b.Job, pos)
			return false, nil // every attached job has it already
		}
		if st.fits(n) && s.host.ClaimMemory(n) {
			break
		}
		if !s.await(ctx, st) {
			return false, fmt.Errorf("%w: group %q holds %d staged bytes (bound W×J×batch = %d×%d×%d) or the node's memory is full; waited %v",
				ErrFull, b.Group, st.bytes, st.spec.Window, st.spec.Jobs, max(st.largest, n), wait)
		}
		if cur, ok := s.stages[b.Group]; !ok || cur != st {
			return false, fmt.Errorf("%w: group %q was deleted or redefined", catalog.ErrNotFound, b.Group)
		}
	}
	bt := &batch{has: make([]bool, st.spec.Jobs)}
	if shm != "" {
		bt.path, bt.size = shm, n
		if in.file != nil {
			bt.held, bt.ino, bt.dev = in.file, in.file.Ino, in.file.Dev
		}
	} else {
		bt.data = append([]byte(nil), in.data...)
	}
	bt.has[b.Job] = true
	st.staged[pos] = bt
	if !st.anyStaged || pos > st.newest {
		st.newest, st.anyStaged = pos, true
	}
	st.bytes += n
	st.largest = max(st.largest, n)
	st.jobs[b.Job].prepared++
	st.putDone(b.Job, pos)
	st.notify()
	if st.complete(bt) {
		s.host.UnclaimMemory(st.drop(pos, bt))
	}
	return true, nil
}
