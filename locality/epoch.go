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
	// owner names the member holding a unit of the order.
	owner func(int32) string
}

// RemoteFrom counts the units of rank r's order from position on that live
// on another node than the rank's.
func (ep *EpochPlan) RemoteFrom(r, position int) int {
	node := ""
	if r < len(ep.Job.Ranks) {
		node = ep.Job.Ranks[r]
	}
	n := 0
	for _, u := range ep.Ranks[r][min(position, len(ep.Ranks[r])):] {
		if ep.owner(u) != node {
			n++
		}
	}
	return n
}

// ErrInvalidJob wraps what Assign refuses in a job's layout.
var ErrInvalidJob = fmt.Errorf("invalid job")

// PlanEpoch computes job j's order for epoch over the ring of members. It is
// a pure function of its arguments, so every node computes the same order.
func PlanEpoch(j *catalog.Job, d *catalog.Dataset, epoch uint64, members []string) (*EpochPlan, error) {
	// A tar dataset is sampled by WebDataset sample, each owned whole.
	units := d.Manifest.Len()
	if d.Manifest.IsTar() {
		units = d.Manifest.Samples()
	}
	return assignEpoch(j, d, epoch, members, Permutation(units, j.Seed, epoch))
}

// assignEpoch assigns the units of perm, in that order, to j's ranks.
func assignEpoch(j *catalog.Job, d *catalog.Dataset, epoch uint64, members []string, perm []int32) (*EpochPlan, error) {
	ring, err := partition.New(members)
	if err != nil {
		return nil, err
	}
	m := d.Manifest
	ownerKey := m.Key
	if m.IsTar() {
		ownerKey = m.SampleKey
	}
	owner := func(i int32) string { return ring.Owner(d.Name, ownerKey(int(i))) }
	p, err := Assign(perm, j.WorldSize, j.BatchSize, j.Ranks, owner)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidJob, err)
	}
	ep := &EpochPlan{Job: j, Data: d, Epoch: epoch, Plan: p, Step: make([]int32, m.Len()), owner: owner}
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

// ResumeEpoch re-splits what remained of an epoch interrupted under an
// earlier layout of the job: every rank of prev had consumed position units
// of its order, and the rest of all of them, taken global step by global
// step, is assigned to j's ranks over members like a fresh epoch's order
// (locality-aware, equal lengths; a tail of fewer than j.WorldSize units is
// dropped). A pure function of its arguments, like PlanEpoch.
func ResumeEpoch(prev *EpochPlan, position int, j *catalog.Job, members []string) (*EpochPlan, error) {
	if position < 0 || len(prev.Ranks) == 0 || position > len(prev.Ranks[0]) {
		return nil, fmt.Errorf("%w: position %d outside the interrupted epoch's %d samples per rank", ErrInvalidJob, position, len(prev.Ranks[0]))
	}
	var rest []int32
	for s := position; s < len(prev.Ranks[0]); s++ {
		for _, order := range prev.Ranks {
			rest = append(rest, order[s])
		}
	}
	return assignEpoch(j, prev.Data, prev.Epoch, members, rest)
}
