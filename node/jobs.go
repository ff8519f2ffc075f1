package node

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"stallfree/catalog"
)

// JobBatch returns minibatch b of a rank's order for an epoch, its items
// pinned until released, and counts them for the job's metrics.
// On a tar dataset the batch is of samples: spans groups the items by sample
// (nil otherwise).
func (n *Node) JobBatch(ctx context.Context, job string, epoch uint64, rank, b int) (items []Item, spans []SampleSpan, err error) {
	if b < 0 {
		return nil, nil, fmt.Errorf("%w: batch %d: want a non-negative integer", ErrBadRequest, b)
	}
	if err := n.ctl.CheckRank(ctx, job, rank, b); err != nil {
		return nil, nil, err
	}
	ep, err := n.ctl.Plan(ctx, job, epoch)
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
	n.jobMetrics.record(ep.Job.Name, rank, items)
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

// jobMetrics counts what each rank of each job was served. A job's series go
// with the job (forgetGone): they were kept for every job ever served, and
// each job has up to ranks × 3 × 2 of them.
type jobMetrics struct {
	items, bytes *prometheus.CounterVec
	mu           sync.Mutex
	jobs         map[string]bool // the jobs with series
}

func newJobMetrics(reg *prometheus.Registry) *jobMetrics {
	m := &jobMetrics{
		items: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stallfree_job_items_total",
			Help: "Items served per job and rank, by where they came from (local, peer, miss)."}, []string{"job", "rank", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stallfree_job_bytes_total",
			Help: "Item bytes served per job and rank, by where they came from."}, []string{"job", "rank", "result"}),
		jobs: map[string]bool{},
	}
	reg.MustRegister(m.items, m.bytes)
	return m
}

// record counts items served to a job's rank.
func (m *jobMetrics) record(job string, rank int, items []Item) {
	// Under mu, so that forgetGone cannot drop the job between the mark and
	// the counts and leave series nobody would drop.
	m.mu.Lock()
	defer m.mu.Unlock()
	m.jobs[job] = true
	r := strconv.Itoa(rank)
	for i := range items {
		res := "local"
		switch items[i].Cache {
		case Peer:
			res = "peer"
		case Miss:
			res = "miss"
		}
		m.items.WithLabelValues(job, r, res).Inc()
		m.bytes.WithLabelValues(job, r, res).Add(float64(len(items[i].Data)))
	}
}

// forgetGone drops the series of the jobs that live no longer knows (the
// catalog's jobs: deleted ones go).
func (m *jobMetrics) forgetGone(live func(job string) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for job := range m.jobs {
		if !live(job) {
			m.items.DeletePartialMatch(prometheus.Labels{"job": job})
			m.bytes.DeletePartialMatch(prometheus.Labels{"job": job})
			delete(m.jobs, job)
		}
	}
}
