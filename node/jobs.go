package node

import (
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"stallfree/catalog"
	"stallfree/locality"
	"stallfree/partition"
)

// ErrNeedPin means the epoch's member set is not pinned yet and this node is
// not the raft leader: ask the leader to pin it, then retry.
var ErrNeedPin = errors.New("epoch not pinned yet")

// maxEpoch bounds epoch numbers in requests.
const maxEpoch = 1 << 40

// EpochPlan is a job's locality-aware order for one epoch.
type EpochPlan struct {
	Job   *catalog.Job
	Data  *catalog.Dataset
	Epoch uint64
	*locality.Plan
	// Step[i] is the global minibatch in which item i is used (-1: dropped
	// tail). The clairvoyant policy reads next uses from it.
	Step []int32
}

type planKey struct {
	job     string
	version uint64
	epoch   uint64
}

// plans caches recent epoch plans; computing one hashes every key of the
// dataset, and every rank of a job asks for the same few epochs.
type plans struct {
	mu    sync.Mutex
	m     map[planKey]*EpochPlan
	order []planKey
}

const maxPlans = 16

func (p *plans) get(k planKey) (*EpochPlan, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ep, ok := p.m[k]
	return ep, ok
}

func (p *plans) put(k planKey, ep *EpochPlan) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.m == nil {
		p.m = map[planKey]*EpochPlan{}
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

// members is the member set a new epoch is pinned to.
func (n *Node) members() []string {
	if n.cl == nil {
		return []string{n.cfg.Name}
	}
	return n.cl.ring().Members()
}

// Plan returns a job's plan for an epoch, pinning the epoch's member set on
// first use (on the leader; followers get ErrNeedPin).
func (n *Node) Plan(job string, epoch uint64) (*EpochPlan, error) {
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
		if !n.cat.IsLeader() {
			return nil, ErrNeedPin
		}
		var err error
		if members, err = n.cat.PinEpoch(job, epoch, n.members()); err != nil {
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

// PredictPlan is the plan an epoch will have if it is pinned to today's
// members: the pinned plan when there is one, else a prediction that pins
// nothing. The clairvoyant policy looks past the epoch boundary with it.
func (n *Node) PredictPlan(job string, epoch uint64) (*EpochPlan, []string, error) {
	if members, ok := n.cat.EpochMembers(job, epoch); ok {
		ep, err := n.Plan(job, epoch)
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
	members := n.members()
	ep, err := planFor(j, d, epoch, members)
	return ep, members, err
}

func planFor(j *catalog.Job, d *catalog.Dataset, epoch uint64, members []string) (*EpochPlan, error) {
	ring, err := partition.New(members)
	if err != nil {
		return nil, err
	}
	perm := locality.Permutation(d.Manifest.Len(), j.Seed, epoch)
	owner := func(i int32) string { return ring.Owner(d.Name, d.Manifest.Key(int(i))) }
	p, err := locality.Assign(perm, j.WorldSize, j.BatchSize, j.Ranks, owner)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	ep := &EpochPlan{Job: j, Data: d, Epoch: epoch, Plan: p, Step: make([]int32, d.Manifest.Len())}
	for i := range ep.Step {
		ep.Step[i] = -1
	}
	for _, order := range p.Ranks {
		for x, i := range order {
			ep.Step[i] = int32(x / p.BatchSize)
		}
	}
	return ep, nil
}

// PinEpoch pins an epoch on the leader (the follower's request, forwarded).
func (n *Node) PinEpoch(job string, epoch uint64) error {
	_, err := n.Plan(job, epoch)
	return err
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

// RecordJobItems counts items served to a job's rank.
func (n *Node) RecordJobItems(job string, rank int, items []Item) {
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
