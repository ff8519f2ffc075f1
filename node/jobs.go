package node

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"

	"github.com/prometheus/client_golang/prometheus"

	"stallfree/catalog"
	"stallfree/locality"
)

// errNeedPin means the epoch's member set is not pinned yet and this node is
// not the raft leader: the leader must pin it first.
var errNeedPin = errors.New("epoch not pinned yet")

// maxEpoch bounds epoch numbers in requests: a million epochs is more than
// any training run has.
const maxEpoch = 1 << 20

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

const maxPlans = 16

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
	for len(p.order) > maxPlans {
		delete(p.m, p.order[0])
		p.order = p.order[1:]
	}
}

// Plan returns a job's locality-aware plan for an epoch. The first request
// for an epoch pins its member set in the catalog (on the leader; a follower
// asks the leader and waits until the pin has reached it), so every node
// computes the same order even while membership changes.
func (n *Node) Plan(ctx context.Context, job string, epoch uint64) (*locality.EpochPlan, error) {
	n.lookupJob(ctx, job) // a job just registered elsewhere may still be on its way here
	ep, err := n.planHere(job, epoch)
	if !errors.Is(err, errNeedPin) {
		return ep, err
	}
	path := fmt.Sprintf("/v1/jobs/%s/epochs/%d/pin", url.PathEscape(job), epoch)
	if _, err := n.forward(ctx, fasthttp.MethodPost, path, nil, nil, 30*time.Second); err != nil {
		return nil, fmt.Errorf("pinning epoch %d of %s: %w", epoch, job, err)
	}
	// The leader answers once the pin is committed; this node may apply it
	// a moment later (a loaded follower lags by a few entries), and planning
	// before that would send the request to the leader again for nothing.
	wctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	n.cat.WaitFor(wctx, func() bool { _, ok := n.cat.EpochMembers(job, epoch); return ok })
	return n.planHere(job, epoch)
}

// planHere is Plan without asking the leader: a follower gets errNeedPin
// for an epoch not pinned yet.
func (n *Node) planHere(job string, epoch uint64) (*locality.EpochPlan, error) {
	if epoch > maxEpoch {
		return nil, fmt.Errorf("%w: epoch %d out of range", ErrBadRequest, epoch)
	}
	j, ok := n.cat.Job(job)
	if !ok {
		return nil, fmt.Errorf("%w: job %q", catalog.ErrNotFound, job)
	}
	d, ok := n.cat.Dataset(j.Dataset)
	if !ok {
		return nil, fmt.Errorf("%w: dataset %q of job %q", catalog.ErrNotFound, j.Dataset, job)
	}
	k := planKey{job, j.Version, epoch}
	if ep, ok := n.plans.get(k); ok {
		return ep, nil
	}
	members, ok := n.cat.EpochMembers(job, epoch)
	if !ok {
		if err := n.reachable(job, epoch); err != nil {
			return nil, err
		}
		if !n.cat.IsLeader() {
			return nil, errNeedPin
		}
		var err error
		if members, err = n.cat.PinEpoch(job, epoch, n.peers.Members()); err != nil {
			return nil, err
		}
	}
	ep, err := planFor(j, d, epoch, members)
	if err != nil {
		return nil, err
	}
	n.plans.put(k, ep)
	return ep, nil
}

// reachable refuses to pin an epoch the job cannot be starting now: reads
// pin, and pins are raft writes, so only the epoch after the latest pinned
// one may be pinned (any epoch, for a job's first, so a run can resume from a
// checkpoint). Each (job, epoch) is pinned once; nothing else a read does
// writes raft.
func (n *Node) reachable(job string, epoch uint64) error {
	latest, ok := n.cat.LatestEpoch(job)
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

// PredictPlan is the plan an epoch will have if it is pinned to today's
// members: the pinned plan when there is one, else a prediction that pins
// nothing. The clairvoyant policy looks past the epoch boundary with it.
func (n *Node) PredictPlan(job string, epoch uint64) (*locality.EpochPlan, []string, error) {
	if members, ok := n.cat.EpochMembers(job, epoch); ok {
		ep, err := n.planHere(job, epoch)
		return ep, members, err
	}
	j, ok := n.cat.Job(job)
	if !ok {
		return nil, nil, fmt.Errorf("%w: job %q", catalog.ErrNotFound, job)
	}
	d, ok := n.cat.Dataset(j.Dataset)
	if !ok {
		return nil, nil, fmt.Errorf("%w: dataset %q", catalog.ErrNotFound, j.Dataset)
	}
	members := n.peers.Members()
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

// PinEpoch pins an epoch's member set; it runs on the leader (a follower's
// Plan relays it there).
func (n *Node) PinEpoch(ctx context.Context, job string, epoch uint64) error {
	if !n.cat.IsLeader() {
		_, err := n.forward(ctx, fasthttp.MethodPost, fmt.Sprintf("/v1/jobs/%s/epochs/%d/pin", url.PathEscape(job), epoch), nil, nil, 30*time.Second)
		return err
	}
	_, err := n.planHere(job, epoch)
	return err
}

// RankOrder is a rank's order for an epoch, as the API answers it.
func (n *Node) RankOrder(ctx context.Context, job string, epoch uint64, rank int) (api.RankOrder, error) {
	ep, err := n.Plan(ctx, job, epoch)
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
func (n *Node) ResumedOrder(ctx context.Context, job string, epoch uint64, rank int, from uint64, position int) (api.RankOrder, error) {
	cur, err := n.Plan(ctx, job, epoch) // pins the epoch's members for the current generation
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
		if ep, err = n.resumePlan(cur, epoch, position); err != nil {
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
func (n *Node) resumePlan(cur *locality.EpochPlan, epoch uint64, position int) (*locality.EpochPlan, error) {
	j := cur.Job
	k := resumeKey{job: j.Name, version: j.Version, epoch: epoch, position: position}
	n.mu.Lock()
	ep, ok := n.resumed[k]
	if ok {
		n.active[j.Name] = k
	}
	n.mu.Unlock()
	if ok {
		return ep, nil
	}
	oldMembers, ok := j.Prev.Pins[epoch]
	if !ok {
		return nil, fmt.Errorf("%w: epoch %d was never started under generation %d: start it afresh", catalog.ErrConflict, epoch, j.Prev.Version)
	}
	members, ok := n.cat.EpochMembers(j.Name, epoch)
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
	n.mu.Lock()
	if len(n.resumed) >= maxPlans {
		clear(n.resumed) // resumes are rare; a bound is all this cache needs
	}
	n.resumed[k] = ep
	n.active[j.Name] = k
	n.mu.Unlock()
	n.foresight.Refresh() // the read-ahead follows the re-split order
	return ep, nil
}

// activeResume is the re-split plan of a job's epoch that a rank on this
// node asked for last, if any: the order the job reads that epoch in.
func (n *Node) activeResume(job string, epoch uint64) (*locality.EpochPlan, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	k, ok := n.active[job]
	if !ok || k.epoch != epoch {
		return nil, false
	}
	j, ok := n.cat.Job(job)
	if !ok || j.Version != k.version {
		return nil, false
	}
	ep, ok := n.resumed[k]
	return ep, ok
}

type resumeKey struct {
	job      string
	version  uint64
	epoch    uint64
	position int
}

// JobBatch returns minibatch b of a rank's order for an epoch, its items
// pinned until released, and counts them for the job's metrics.
// On a tar dataset the batch is of samples: spans groups the items by sample
// (nil otherwise).
func (n *Node) JobBatch(ctx context.Context, job string, epoch uint64, rank, b int) (items []Item, spans []SampleSpan, err error) {
	ep, err := n.Plan(ctx, job, epoch)
	if err != nil {
		return nil, nil, err
	}
	if rank < 0 || rank >= len(ep.Ranks) {
		return nil, nil, fmt.Errorf("%w: rank %d: want an integer in [0,%d)", ErrBadRequest, rank, len(ep.Ranks))
	}
	if b < 0 || b >= ep.Batches() {
		return nil, nil, fmt.Errorf("%w: batch %d: want an integer in [0,%d)", ErrBadRequest, b, ep.Batches())
	}
	// GetManyFor holds it to the limits of /batch: a job registered with a
	// huge batch_size must not make one response of gigabytes.
	batch := ep.Batch(rank, b)
	idx := make([]int, len(batch))
	for j, i := range batch {
		idx[j] = int(i)
	}
	if ep.Data.Manifest.IsTar() {
		items, spans, err = n.GetSamplesFor(ctx, ep.Data, idx, ep.Job.Name)
	} else {
		items, err = n.GetManyFor(ctx, ep.Data, idx, ep.Job.Name)
	}
	if err != nil {
		return nil, nil, err
	}
	n.recordJobItems(ep.Job.Name, rank, items)
	return items, spans, nil
}

// SampleSpan places a WebDataset sample among a batch's items: its key, and
// the end of its members (they start where the previous sample's end).
type SampleSpan struct {
	Key string
	End int
}

// GetSamplesFor returns the members of samples of a tar dataset, sample after
// sample in the order asked, for a job (or "" for none).
func (n *Node) GetSamplesFor(ctx context.Context, d *catalog.Dataset, samples []int, job string) ([]Item, []SampleSpan, error) {
	m := d.Manifest
	if !m.IsTar() {
		return nil, nil, fmt.Errorf("%w: dataset %s is not a tar dataset: it has items, not samples", ErrBadRequest, d.Name)
	}
	if len(samples) > MaxBatch {
		return nil, nil, fmt.Errorf("%w: %d samples in one batch; the limit is %d", ErrTooLarge, len(samples), MaxBatch)
	}
	spans := make([]SampleSpan, len(samples))
	var idx []int
	for j, s := range samples {
		if s < 0 || s >= m.Samples() {
			return nil, nil, fmt.Errorf("%w: sample %d out of range [0,%d)", ErrBadRequest, s, m.Samples())
		}
		first, end := m.Sample(s)
		for i := first; i < end; i++ {
			idx = append(idx, i)
		}
		spans[j] = SampleSpan{Key: m.SampleKey(s), End: len(idx)}
	}
	items, err := n.GetManyFor(ctx, d, idx, job)
	if err != nil {
		return nil, nil, err
	}
	return items, spans, nil
}

// jobMetrics counts what each rank of each job was served.
type jobMetrics struct {
	items, bytes *prometheus.CounterVec
}

func newJobMetrics(reg *prometheus.Registry) *jobMetrics {
	m := &jobMetrics{
		items: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stallfree_job_items_total",
			Help: "Items served per job and rank, by where they came from (local, peer, miss)."}, []string{"job", "rank", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stallfree_job_bytes_total",
			Help: "Item bytes served per job and rank, by where they came from."}, []string{"job", "rank", "result"}),
	}
	reg.MustRegister(m.items, m.bytes)
	return m
}

// recordJobItems counts items served to a job's rank.
func (n *Node) recordJobItems(job string, rank int, items []Item) {
	r := strconv.Itoa(rank)
	for i := range items {
		res := "local"
		switch items[i].Cache {
		case Peer:
			res = "peer"
		case Miss:
			res = "miss"
		}
		n.jobMetrics.items.WithLabelValues(job, r, res).Inc()
		n.jobMetrics.bytes.WithLabelValues(job, r, res).Add(float64(len(items[i].Data)))
	}
}

// rankPosition is a reported position and when it came.
type rankPosition struct {
	api.RankPosition
	at time.Time
}

// ReportPosition records how far a rank of job has got (its sampler reports
// at each checkpoint). Kept in memory on the node told, for operators.
func (n *Node) ReportPosition(job string, p api.RankPosition) error {
	j, ok := n.cat.Job(job)
	if !ok {
		return fmt.Errorf("%w: job %q", catalog.ErrNotFound, job)
	}
	if p.Rank >= api.MaxWorldSize || p.Epoch > maxEpoch {
		return fmt.Errorf("%w: rank %d, epoch %d out of range", ErrBadRequest, p.Rank, p.Epoch)
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	ranks := n.positions[job]
	if ranks == nil || len(ranks) > 4*j.WorldSize+64 { // a bound on what reports can grow
		ranks = map[int]rankPosition{}
		n.positions[job] = ranks
	}
	ranks[p.Rank] = rankPosition{RankPosition: p, at: time.Now()}
	return nil
}

// RankPositions lists the positions reported to this node for job, by rank.
func (n *Node) RankPositions(job string) []api.RankPosition {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := []api.RankPosition{}
	for _, p := range n.positions[job] {
		p.SecondsAgo = time.Since(p.at).Seconds()
		out = append(out, p.RankPosition)
	}
	slices.SortFunc(out, func(a, b api.RankPosition) int { return a.Rank - b.Rank })
	return out
}
