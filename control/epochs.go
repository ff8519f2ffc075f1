package control

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/locality"
)

// errNeedPin means the epoch's member set is not pinned yet: the leader must
// pin it first.
var errNeedPin = errors.New("epoch not pinned yet")

// MaxEpoch bounds epoch numbers in requests: a million epochs is more than
// any training run has.
const MaxEpoch = 1 << 20

type planKey struct {
	job     string
	version uint64
	epoch   uint64
}

// plans caches recent epoch plans; computing one hashes every key of the
// dataset, and every rank of a job asks for the same few epochs.
type plans struct {
	mu    sync.Mutex
	m     map[planKey]*locality.EpochPlan
	order []planKey
}

// MaxPlans bounds the epoch plans a node keeps, and the re-split plans.
const MaxPlans = 16

func (p *plans) get(k planKey) (*locality.EpochPlan, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ep, ok := p.m[k]
	return ep, ok
}

func (p *plans) put(k planKey, ep *locality.EpochPlan) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[planKey]*locality.EpochPlan{}
	}
	if _, ok := p.m[k]; ok {
		return
	}
	p.m[k] = ep
	p.order = append(p.order, k)
	for len(p.order) > MaxPlans {
		delete(p.m, p.order[0])
		p.order = p.order[1:]
	}
}

// Plan returns a job's locality-aware plan for an epoch. The first request
// for an epoch pins its member set in the catalog (through Leader: a
// follower asks the leader and waits until the pin has reached it), so every
// node computes the same order even while membership changes.
func (c *Control) Plan(ctx context.Context, job string, epoch uint64) (*locality.EpochPlan, error) {
	c.lookupJob(ctx, job) // a job just registered elsewhere may still be on its way here
	ep, err := c.pinnedPlan(job, epoch, false)
	if !errors.Is(err, errNeedPin) {
		return ep, err
	}
	if err := c.Leader().PinEpoch(ctx, job, epoch); err != nil {
		return nil, fmt.Errorf("pinning epoch %d of %s: %w", epoch, job, err)
	}
	// The leader answers once the pin is committed; this node may apply it
	// a moment later (a loaded follower lags by a few entries), and planning
	// before that would send the request to the leader again for nothing.
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	c.cat.WaitFor(wctx, func() bool { _, ok := c.cat.EpochMembers(job, epoch); return ok })
	return c.pinnedPlan(job, epoch, false)
}

// pinnedPlan is an epoch's plan from what this node's catalog holds. An
// epoch not pinned yet is pinned to today's members when pin is set (only
// the leader may: localLeader.PinEpoch), else it is errNeedPin.
func (c *Control) pinnedPlan(job string, epoch uint64, pin bool) (*locality.EpochPlan, error) {
	if epoch > MaxEpoch {
		return nil, fmt.Errorf("%w: epoch %d out of range", ErrBadRequest, epoch)
	}
	j, ok := c.cat.Job(job)
	if !ok {
		return nil, fmt.Errorf("%w: job %q", catalog.ErrNotFound, job)
	}
	d, ok := c.cat.Dataset(j.Dataset)
	if !ok {
		return nil, fmt.Errorf("%w: dataset %q of job %q", catalog.ErrNotFound, j.Dataset, job)
	}
	k := planKey{job, j.Version, epoch}
	if ep, ok := c.plans.get(k); ok {
		return ep, nil
	}
	members, ok := c.cat.EpochMembers(job, epoch)
	if !ok {
		if err := c.reachable(job, epoch); err != nil {
			return nil, err
		}
		if !pin {
			return nil, errNeedPin
		}
		var err error
		if members, err = c.cat.PinEpoch(job, epoch, c.members.Members()); err != nil {
			return nil, err
		}
	}
	ep, err := planFor(j, d, epoch, members)
	if err != nil {
		return nil, err
	}
	c.plans.put(k, ep)
	return ep, nil
}

// reachable refuses to pin an epoch the job cannot be starting now: reads
// pin, and pins are raft writes, so only the epoch after the latest pinned
// one may be pinned (any epoch, for a job's first, so a run can resume from a
// checkpoint). Each (job, epoch) is pinned once; nothing else a read does
// writes raft.
func (c *Control) reachable(job string, epoch uint64) error {
	latest, ok := c.cat.LatestEpoch(job)
	switch {
	case !ok:
		return nil
	case epoch > latest+1:
		return fmt.Errorf("%w: epoch %d: job %s is at epoch %d; the next to start is %d", ErrBadRequest, epoch, job, latest, latest+1)
	case epoch < latest:
		return fmt.Errorf("%w: epoch %d of job %s is over (the job is at epoch %d) and its layout is no longer kept", ErrBadRequest, epoch, job, latest)
	}
	return nil
}

// ReadingPlan is the order a job reads an epoch in, as far as this node's
// catalog knows it: the re-split plan a rank here asked for last when the
// epoch was resumed after a resize, else the pinned plan. The clairvoyant
// policy reads ahead along it. On the leader an epoch not pinned yet is
// pinned, as a rank's first read would pin it; a follower waits for the pin
// (errNeedPin) rather than relay from a background loop.
func (c *Control) ReadingPlan(job string, epoch uint64) (*locality.EpochPlan, error) {
	if ep, ok := c.activeResume(job, epoch); ok {
		return ep, nil
	}
	return c.pinnedPlan(job, epoch, c.cat.IsLeader())
}

// PredictPlan is the plan an epoch will have if it is pinned to today's
// members: the pinned plan when there is one, else a prediction that pins
// nothing. The clairvoyant policy looks past the epoch boundary with it.
func (c *Control) PredictPlan(job string, epoch uint64) (*locality.EpochPlan, []string, error) {
	if members, ok := c.cat.EpochMembers(job, epoch); ok {
		ep, err := c.pinnedPlan(job, epoch, false)
		return ep, members, err
	}
	j, ok := c.cat.Job(job)
	if !ok {
		return nil, nil, fmt.Errorf("%w: job %q", catalog.ErrNotFound, job)
	}
	d, ok := c.cat.Dataset(j.Dataset)
	if !ok {
		return nil, nil, fmt.Errorf("%w: dataset %q", catalog.ErrNotFound, j.Dataset)
	}
	members := c.members.Members()
	ep, err := planFor(j, d, epoch, members)
	return ep, members, err
}

func planFor(j *catalog.Job, d *catalog.Dataset, epoch uint64, members []string) (*locality.EpochPlan, error) {
	ep, err := locality.PlanEpoch(j, d, epoch, members)
	if errors.Is(err, locality.ErrInvalidJob) {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return ep, err
}

// PinEpoch pins an epoch's member set on the leader (a follower's Plan
// relays it there).
func (c *Control) PinEpoch(ctx context.Context, job string, epoch uint64) error {
	return c.Leader().PinEpoch(ctx, job, epoch)
}

// CheckRank refuses a rank (and, when batch ≥ 0 is given, a minibatch)
// outside the job's layout, before anything is planned or pinned: a
// malformed read changes nothing. A job made through another node a moment
// ago is waited for, as Plan would; one still unknown is left to Plan (404).
func (c *Control) CheckRank(ctx context.Context, job string, rank, batch int) error {
	j, ok := c.lookupJob(ctx, job)
	if !ok {
		return nil
	}
	d, ok := c.cat.Dataset(j.Dataset)
	if !ok {
		return nil
	}
	ranks, batches := locality.Shape(j, d)
	if rank < 0 || rank >= ranks {
		return fmt.Errorf("%w: rank %d: want an integer in [0,%d)", ErrBadRequest, rank, ranks)
	}
	if batch >= 0 && batch >= batches {
		return fmt.Errorf("%w: batch %d: want an integer in [0,%d)", ErrBadRequest, batch, batches)
	}
	return nil
}

// RankOrder is a rank's order for an epoch, as the API answers it.
func (c *Control) RankOrder(ctx context.Context, job string, epoch uint64, rank int) (api.RankOrder, error) {
	if err := c.CheckRank(ctx, job, rank, -1); err != nil {
		return api.RankOrder{}, err
	}
	ep, err := c.Plan(ctx, job, epoch)
	if err != nil {
		return api.RankOrder{}, err
	}
	if rank < 0 || rank >= len(ep.Ranks) {
		return api.RankOrder{}, fmt.Errorf("%w: rank %d: want an integer in [0,%d)", ErrBadRequest, rank, len(ep.Ranks))
	}
	return orderOf(ep, rank, 0, epoch), nil
}

// orderOf is rank's order in ep from position start on.
func orderOf(ep *locality.EpochPlan, rank, start int, epoch uint64) api.RankOrder {
	order := ep.Ranks[rank][start:]
	indices := make([]int, len(order))
	for x, i := range order {
		indices[x] = int(i)
	}
	remote := ep.Remote[rank]
	if start > 0 {
		remote = ep.RemoteFrom(rank, start)
	}
	return api.RankOrder{Indices: indices, Batches: (len(indices) + ep.BatchSize - 1) / ep.BatchSize, BatchSize: ep.BatchSize,
		Remote: remote, Epoch: epoch}
}

// ResumedOrder is rank's order for the rest of an epoch that was interrupted
// when every rank of generation from had consumed position samples of it.
// Under the current generation that is the rank's own order from position
// on; under the job's previous one (only world_size or ranks changed since),
// it is the rank's share of what every old rank had left, re-split over the
// current layout (locality.ResumeEpoch): each remaining sample exactly once,
// equal lengths. Like every order, a pure function of the catalog.
func (c *Control) ResumedOrder(ctx context.Context, job string, epoch uint64, rank int, from uint64, position int) (api.RankOrder, error) {
	// The rank and the generation are checked before the epoch is pinned.
	if err := c.CheckRank(ctx, job, rank, -1); err != nil {
		return api.RankOrder{}, err
	}
	if j, ok := c.lookupJob(ctx, job); ok && from != j.Version && (j.Prev == nil || from != j.Prev.Version) {
		return api.RankOrder{}, fmt.Errorf("%w: generation %d is neither job %s's current one (%d) nor the one it replaced", catalog.ErrConflict, from, job, j.Version)
	}
	cur, err := c.Plan(ctx, job, epoch) // pins the epoch's members for the current generation
	if err != nil {
		return api.RankOrder{}, err
	}
	if rank < 0 || rank >= len(cur.Ranks) {
		return api.RankOrder{}, fmt.Errorf("%w: rank %d: want an integer in [0,%d)", ErrBadRequest, rank, len(cur.Ranks))
	}
	j := cur.Job
	ep, start := cur, position
	switch {
	case from == j.Version:
		if position < 0 || position > len(cur.Ranks[rank]) {
			return api.RankOrder{}, fmt.Errorf("%w: position %d outside the rank's %d samples", ErrBadRequest, position, len(cur.Ranks[rank]))
		}
	case j.Prev != nil && from == j.Prev.Version:
		if ep, err = c.resumePlan(cur, epoch, position); err != nil {
			return api.RankOrder{}, err
		}
		start = 0
	default:
		return api.RankOrder{}, fmt.Errorf("%w: generation %d is neither job %s's current one (%d) nor the one it replaced", catalog.ErrConflict, from, job, j.Version)
	}
	return orderOf(ep, rank, start, epoch), nil
}

// resumePlan re-splits the rest of epoch of the previous generation, whose
// ranks had all consumed position samples, over the current one.
func (c *Control) resumePlan(cur *locality.EpochPlan, epoch uint64, position int) (*locality.EpochPlan, error) {
	j := cur.Job
	k := resumeKey{job: j.Name, version: j.Version, epoch: epoch, position: position}
	c.mu.Lock()
	ep, ok := c.resumed[k]
	if ok {
		c.active[j.Name] = k
	}
	c.mu.Unlock()
	if ok {
		return ep, nil
	}
	oldMembers, ok := j.Prev.Pins[epoch]
	if !ok {
		return nil, fmt.Errorf("%w: epoch %d was never started under generation %d: start it afresh", catalog.ErrConflict, epoch, j.Prev.Version)
	}
	members, ok := c.cat.EpochMembers(j.Name, epoch)
	if !ok {
		return nil, fmt.Errorf("epoch %d of %s is not pinned", epoch, j.Name)
	}
	prev, err := planFor(j.AsJob(j.Prev), cur.Data, epoch, oldMembers)
	if err != nil {
		return nil, err
	}
	if ep, err = locality.ResumeEpoch(prev, position, j, members); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	c.mu.Lock()
	if len(c.resumed) >= MaxPlans {
		clear(c.resumed) // resumes are rare; a bound is all this cache needs
	}
	c.resumed[k] = ep
	c.active[j.Name] = k
	c.mu.Unlock()
	if c.cfg.Replanned != nil {
		c.cfg.Replanned() // the read-ahead follows the re-split order
	}
	return ep, nil
}

// activeResume is the re-split plan of a job's epoch that a rank on this
// node asked for last, if any: the order the job reads that epoch in.
func (c *Control) activeResume(job string, epoch uint64) (*locality.EpochPlan, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	k, ok := c.active[job]
	if !ok || k.epoch != epoch {
		return nil, false
	}
	j, ok := c.cat.Job(job)
	if !ok || j.Version != k.version {
		return nil, false
	}
	ep, ok := c.resumed[k]
	return ep, ok
}

type resumeKey struct {
	job      string
	version  uint64
	epoch    uint64
	position int
}

// rankPosition is a reported position and when it came.
type rankPosition struct {
	api.RankPosition
	at time.Time
}

// ReportPosition records how far a rank of job has got (its sampler reports
// at each checkpoint). Kept in memory on the node told, for operators.
func (c *Control) ReportPosition(job string, p api.RankPosition) error {
	j, ok := c.cat.Job(job)
	if !ok {
		return fmt.Errorf("%w: job %q", catalog.ErrNotFound, job)
	}
	if p.Rank >= api.MaxWorldSize || p.Epoch > MaxEpoch {
		return fmt.Errorf("%w: rank %d, epoch %d out of range", ErrBadRequest, p.Rank, p.Epoch)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ranks := c.positions[job]
	if ranks == nil || len(ranks) > 4*j.WorldSize+64 { // a bound on what reports can grow
		ranks = map[int]rankPosition{}
		c.positions[job] = ranks
	}
	ranks[p.Rank] = rankPosition{RankPosition: p, at: time.Now()}
	return nil
}

// ForgetGoneJobs drops what this node keeps of jobs the catalog no longer
// has (deleted): their ranks' positions and their active re-split plans.
// A job made and deleted over and over left its positions behind each time.
func (c *Control) ForgetGoneJobs() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for job := range c.positions {
		if _, ok := c.cat.Job(job); !ok {
			delete(c.positions, job)
		}
	}
	for job, k := range c.active {
		if _, ok := c.cat.Job(job); !ok {
			delete(c.active, job)
			delete(c.resumed, k)
		}
	}
}

// RankPositions lists the positions reported to this node for job, by rank.
func (c *Control) RankPositions(job string) []api.RankPosition {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := []api.RankPosition{}
	for _, p := range c.positions[job] {
		p.SecondsAgo = time.Since(p.at).Seconds()
		out = append(out, p.RankPosition)
	}
	slices.SortFunc(out, func(a, b api.RankPosition) int { return a.Rank - b.Rank })
	return out
}
