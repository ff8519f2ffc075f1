// Package groups holds the rules of coordinated prep (docs/api.md): J jobs
// of one hyper-parameter search read one dataset in one seeded order; each
// batch is prepared by one job and staged at the group's owner node, where
// the others read it. The catalog holds a group's definition; its owner
// holds the staged batches and what each job has done, and decides when a
// job is detached.
package groups

import "slices"

// Detached is one detached job as the assignment needs it: from position
// From on (epoch·batches + batch), its batches are prepared by the attached
// jobs instead.
type Detached struct {
	Job  int
	From uint64
}

// Producer is the job index that prepares the batch at position pos (epoch
// e, batch b: pos = e·batches + b) of a group of jobs jobs, given its
// detached jobs; -1 when every job is detached there.
//
// The rule, which every job computes alike from GET /v1/groups/{g} (python
// stallfree/coordinated.py has the same function):
//   - job b mod J prepares batch b (the contract's rule), unless it is
//     detached from pos or earlier;
//   - otherwise the batch goes round-robin over the jobs attached at pos, in
//     job order: with D the jobs detached at pos (sorted) and A the others,
//     the producer is A[((b div J)·|D| + index of (b mod J) in D) mod |A|].
//     So the batches of several detached jobs are spread evenly, not all
//     handed to the first attached job.
//
// A detached job's From is one past the last batch it staged (its owner
// staged every batch it was given up to there, in order), so no batch is
// left without a producer and none that it staged is given away.
func Producer(jobs, batches int, detached []Detached, pos uint64) int {
	if jobs < 1 || batches < 1 {
		return -1
	}
	b := int(pos % uint64(batches))
	base := b % jobs
	var d []int
	for _, x := range detached {
		if x.From <= pos && x.Job >= 0 && x.Job < jobs {
			d = append(d, x.Job)
		}
	}
	slices.Sort(d)
	d = slices.Compact(d)
	at, isDetached := slices.BinarySearch(d, base)
	if !isDetached {
		return base
	}
	attached := jobs - len(d)
	if attached == 0 {
		return -1
	}
	k := ((b/jobs)*len(d) + at) % attached
	// The k-th job index not in d.
	for j := range jobs {
		if _, in := slices.BinarySearch(d, j); in {
			continue
		}
		if k == 0 {
			return j
		}
		k--
	}
	return -1
}
