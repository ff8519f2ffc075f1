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
	perm := Permutation(d.Manifest.Len(), j.Seed, epoch)
	owner := func(i int32) string { return ring.Owner(d.Name, d.Manifest.Key(int(i))) }
	p, err := Assign(perm, j.WorldSize, j.BatchSize, j.Ranks, owner)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidJob, err)
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
