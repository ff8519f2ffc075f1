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
	return assignEpoch(j, d, epoch, members, Permutation(units(d), j.Seed, epoch))
}

// units is what a job over d samples: its items, or a tar dataset's
// WebDataset samples, each owned whole.
func units(d *catalog.Dataset) int {
	if d.Manifest.IsTar() {
		return d.Manifest.Samples()
	}
	return d.Manifest.Len()
}

// Shape is the ranks and the minibatches per rank that every epoch plan of j
// over d has (Assign's), known without planning an epoch: a request naming a
// rank or batch outside it is refused before it pins anything.
func Shape(j *catalog.Job, d *catalog.Dataset) (ranks, batches int) {
	if j.WorldSize < 1 || j.BatchSize < 1 {
		return 0, 0
	}
	per := units(d) / j.WorldSize
	return j.WorldSize, (per + j.BatchSize - 1) / j.BatchSize
}

// assignEpoch assigns the units of perm, in that order, to j's ranks.
func assignEpoch(j *catalog.Job, d *catalog.Dataset, epoch uint64, members []string, perm []int32) (*EpochPlan, error) {
	owner, err := unitOwner(d, members)
	if err != nil {
		return nil, err
	}
	m := d.Manifest
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
// of its order, and the rest of all of them is assigned to j's ranks over
// members (locality-aware, equal lengths; a tail of fewer than j.WorldSize
// units is dropped). A pure function of its arguments, like PlanEpoch.
//
// The rest is not cut into global minibatches as it stands: each old rank's
// order holds its own node's units first and the remote ones last in every
// step, so consecutive stretches of the rest are lopsided by owner, and a
// node that had no rank before (its units were only ever overflow) finds
// too few of its own in each new step. Which units make up a global step of
// the remainder does not matter to SGD (the steps of an epoch are a random
// partition either way), so the rest is first regrouped by owner: see
// byOwner.
func ResumeEpoch(prev *EpochPlan, position int, j *catalog.Job, members []string) (*EpochPlan, error) {
	if position < 0 || len(prev.Ranks) == 0 || position > len(prev.Ranks[0]) {
		return nil, fmt.Errorf("%w: position %d outside the interrupted epoch's %d samples per rank", ErrInvalidJob, position, len(prev.Ranks[0]))
	}
	if j.WorldSize < 1 || j.BatchSize < 1 {
		return nil, fmt.Errorf("%w: world size %d and batch size %d must be positive", ErrInvalidJob, j.WorldSize, j.BatchSize)
	}
	var rest []int32
	for s := position; s < len(prev.Ranks[0]); s++ {
		for _, order := range prev.Ranks {
			rest = append(rest, order[s])
		}
	}
	owner, err := unitOwner(prev.Data, members)
	if err != nil {
		return nil, err
	}
	rest = byOwner(rest, j.WorldSize*j.BatchSize, rankDemand(j.Ranks, j.BatchSize), owner)
	return assignEpoch(j, prev.Data, prev.Epoch, members, rest)
}

// rankDemand is, per node, the units one global step gives the ranks on it.
// Ranks on no node ("") count under "", which owns no unit, so byOwner never
// reads it.
func rankDemand(rankNode []string, batchSize int) map[string]int {
	demand := map[string]int{}
	for _, node := range rankNode {
		demand[node] += batchSize
	}
	return demand
}

// byOwner reorders units so that each full global step of size global holds,
// for every node that runs ranks, as many of the node's own units as its
// ranks take in a step (demand), while the node has any left; the rest of a
// step is filled from the owners with the most units to spare beyond what
// their ranks will still take. Every unit stays exactly once; within an
// owner the units keep their order. Assign then finds a local rank for each
// unit of a step but the fill, so the remote reads of the whole remainder
// come down to how far each node's share of it falls short of its ranks'
// share: a difference of totals, not a sum of per-step shortfalls.
func byOwner(units []int32, global int, demand map[string]int, owner func(int32) string) []int32 {
	queues := map[string][]int32{}
	var nodes []string // owners in order of first appearance: deterministic
	for _, u := range units {
		o := owner(u)
		if _, seen := queues[o]; !seen {
			nodes = append(nodes, o)
		}
		queues[o] = append(queues[o], u)
	}
	out := make([]int32, 0, len(units))
	steps := len(units) / global
	for step := range steps {
		taken := 0
		for _, node := range nodes {
			n := min(demand[node], len(queues[node]))
			out = append(out, queues[node][:n]...)
			queues[node] = queues[node][n:]
			taken += n
		}
		later := steps - step - 1 // full steps after this one
		for ; taken < global; taken++ {
			best, spare := "", 0
			for _, node := range nodes {
				left := len(queues[node])
				if left == 0 {
					continue
				}
				if s := left - demand[node]*later; best == "" || s > spare {
					best, spare = node, s
				}
			}
			out = append(out, queues[best][0])
			queues[best] = queues[best][1:]
		}
	}
	for _, node := range nodes { // the last, partial step
		out = append(out, queues[node]...)
	}
	return out
}

// unitOwner names the member that holds a unit of the order (an item, or a
// tar dataset's sample) on the ring of members.
func unitOwner(d *catalog.Dataset, members []string) (func(int32) string, error) {
	ring, err := partition.New(members)
	if err != nil {
		return nil, err
	}
	ownerKey := d.Manifest.Key
	if d.Manifest.IsTar() {
		ownerKey = d.Manifest.SampleKey
	}
	return func(i int32) string { return ring.Owner(d.RingName(), ownerKey(int(i))) }, nil
}
