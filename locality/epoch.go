package locality

import (
	"fmt"

	"stallfree/catalog"
	"stallfree/partition"
)

// EpochPlan is a registered job's locality-aware order for one epoch, over
// the member set the epoch is pinned to.
type EpochPlan struct {
	Job   *catalog.Job
	Data  *catalog.Dataset
	Epoch uint64
	*Plan
	// Step[i] is the global minibatch in which item i is used (-1: dropped
	// tail). The clairvoyant policy reads next uses from it.
	Step []int32
}

// ErrInvalidJob wraps what Assign refuses in a job's layout.
var ErrInvalidJob = fmt.Errorf("invalid job")

// PlanEpoch computes job j's order for epoch over the ring of members. It is
// a pure function of its arguments, so every node computes the same order.
func PlanEpoch(j *catalog.Job, d *catalog.Dataset, epoch uint64, members []string) (*EpochPlan, error) {
	ring, err := partition.New(members)
	if err != nil {
		return nil, err
	}
	m := d.Manifest
	// A tar dataset is sampled by WebDataset sample, each owned whole.
	units, ownerKey := m.Len(), m.Key
	if m.IsTar() {
		units, ownerKey = m.Samples(), m.SampleKey
	}
	perm := Permutation(units, j.Seed, epoch)
	owner := func(i int32) string { return ring.Owner(d.Name, ownerKey(int(i))) }
	p, err := Assign(perm, j.WorldSize, j.BatchSize, j.Ranks, owner)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidJob, err)
	}
	ep := &EpochPlan{Job: j, Data: d, Epoch: epoch, Plan: p, Step: make([]int32, m.Len())}
	for i := range ep.Step {
		ep.Step[i] = -1
	}
	for _, order := range p.Ranks {
		for x, u := range order {
			first, end := ep.items(u)
			for i := first; i < end; i++ {
				ep.Step[i] = int32(x / p.BatchSize)
			}
		}
	}
	return ep, nil
}

// items are the items [first, end) of a unit of the order: the item itself,
// or a tar dataset's sample's members.
func (ep *EpochPlan) items(u int32) (first, end int) {
	if !ep.Data.Manifest.IsTar() {
		return int(u), int(u) + 1
	}
	return ep.Data.Manifest.Sample(int(u))
}

// BatchItems are the items minibatch b of rank r reads: Batch's indices, or
// for a tar dataset the members of Batch's samples, in order.
func (ep *EpochPlan) BatchItems(r, b int) []int32 {
	batch := ep.Batch(r, b)
	if !ep.Data.Manifest.IsTar() {
		return batch
	}
	var out []int32
	for _, u := range batch {
		first, end := ep.items(u)
		for i := first; i < end; i++ {
			out = append(out, int32(i))
		}
	}
	return out
}
