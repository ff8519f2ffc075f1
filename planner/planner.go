// Package planner splits cache memory between training jobs by how much each
// one's epoch time depends on it (Synergy, OSDI '22): from what was measured
// of each job (step time, wait, the bytes its dataset read from storage, the
// storage's throughput) it predicts the job's epoch time as a function of
// the bytes cached of its dataset, finds the knee where more cache no longer
// shortens the epoch, and hands memory out unit by unit to the dataset whose
// jobs save the most seconds per unit, each up to its knee, with a floor so
// that no job gets less than under a proportional split.
//
// Pure functions: no clocks, no I/O; the node gathers the inputs.
package planner

import (
	"cmp"
	"math"
	"slices"
)

// GiB is the unit seconds saved are quoted per.
const GiB = 1 << 30

// DefaultMargin is Input.Margin's default.
const DefaultMargin = 0.25

// Job is what was measured of one training job over its last complete
// epoch. Times are per rank (the ranks of a job run side by side), bytes
// cluster-wide.
type Job struct {
	Name    string
	Dataset string
	Ranks   int
	// EpochS is the measured epoch: what the loop spent waiting for batches
	// plus what it spent on them (StepS), averaged over the ranks.
	EpochS float64
	StepS  float64
	// Items and Batches are how many items, in how many batches, one rank
	// read in the epoch.
	Items, Batches float64
	// MissBytes is what the dataset read from storage during the epoch.
	MissBytes float64
}

// Dataset is a dataset some job reads.
type Dataset struct {
	Name  string
	Bytes float64
	// StorageBps is its storage's measured throughput (bytes per second
	// while reads were in flight); 0 when nothing was read yet.
	StorageBps float64
	// Cached is what the cluster holds of it now; Current is what it is
	// allowed (its quota when it has one, else Cached).
	Cached, Current float64
}

// Input is everything Plan needs.
type Input struct {
	// Memory is the cache memory to split (the cluster's, less what
	// datasets no reporting job reads hold).
	Memory   float64
	Jobs     []Job
	Datasets map[string]Dataset
	// Margin is the share of a job's compute time that fetching must stay
	// under at the knee (default 0.25): a pipelined loader needs slack, since
	// misses do not arrive evenly over the epoch (the split bench saw a job
	// given fetching at 88% of its compute wait 5-10% more per epoch).
	Margin float64
	// Unit is how much memory each greedy step hands out (default
	// min(1 GiB, Memory/128)).
	Unit float64
}

// Model predicts one job's epoch time from the bytes cached of its dataset:
//
//	epoch(c) = max(C, F(c)) + min(C, F(c))/N + R,  F(c) = A + (D − c)/B
//
// C is the compute (step) time, overlapped with fetching F by the loader's
// read-ahead: a two-stage pipeline over N batches takes the longer stage
// plus one batch of the shorter (the first batch is fetched before any
// compute, the last computed after every fetch). Fetching costs A for what
// comes from memory (local or peer) plus the bytes not cached at the storage
// throughput B (MinIO: every epoch reads exactly the uncached bytes). R is
// what the measured epoch had beyond that (stragglers, uneven misses).
type Model struct {
	C, A, D, B, N, R float64
}

// Epoch predicts the epoch time with c bytes cached.
func (m Model) Epoch(c float64) float64 {
	return m.pipeline(m.fetch(c)) + m.R
}

func (m Model) pipeline(f float64) float64 {
	return math.Max(m.C, f) + math.Min(m.C, f)/math.Max(m.N, 1)
}

// maxFetch is the longest fetch time the pipeline fits in an epoch of e.
func (m Model) maxFetch(e float64) float64 {
	n := math.Max(m.N, 1)
	if f := e - m.C/n; f >= m.C { // fetch-bound: F + C/N = e
		return f
	}
	return math.Max(0, math.Min(m.C, n*(e-m.C))) // compute-bound: C + F/N = e
}

func (m Model) fetch(c float64) float64 {
	if m.B <= 0 {
		return m.A
	}
	return m.A + math.Max(0, m.D-c)/m.B
}

// Knee is the least cached bytes past which the epoch no longer shortens,
// less the margin: where fetching fits within (1 − margin) of compute, or
// the whole dataset when even fetching everything from memory does not.
// With an unknown storage throughput nothing can be said: the whole dataset.
func (m Model) Knee(margin float64) float64 {
	target := m.C*(1-margin) - m.A
	if m.B <= 0 || target <= 0 {
		return m.D
	}
	return math.Min(m.D, math.Max(0, m.D-m.B*target))
}

// Fit builds a job's model. hitCost is the fetch time per item served from
// memory, learnt from fetch-bound jobs (see HitCost); a fetch-bound job fits
// its own.
func Fit(j Job, d Dataset, hitCost float64) Model {
	m := Model{C: j.StepS, D: d.Bytes, B: d.StorageBps, N: j.Batches}
	storage := 0.0
	if m.B > 0 {
		storage = j.MissBytes / m.B
	}
	// What the measured epoch says fetching took at most (the pipeline at
	// the measured point must not exceed it): all of that when the loop
	// mostly waited (fetch-bound), else what hits cost fetch-bound jobs.
	room := math.Max(0, m.maxFetch(j.EpochS)-storage)
	if fetchBound(j) {
		m.A = room
	} else {
		m.A = math.Min(hitCost*j.Items, room)
	}
	cMeas := math.Max(0, m.D-j.MissBytes)
	m.R = math.Max(0, j.EpochS-m.pipeline(m.fetch(cMeas)))
	return m
}

// fetchBound: the loop waited for data more than it computed.
func fetchBound(j Job) bool { return j.EpochS > 0 && j.EpochS-j.StepS > j.StepS }

// HitCost is the fetch time per item served from memory, from the jobs that
// were fetch-bound (their epoch is their fetch time): the mean of what
// their epochs had beyond their storage reads, per item; 0 when none was.
func HitCost(jobs []Job, ds map[string]Dataset) float64 {
	var sum, items float64
	for _, j := range jobs {
		d := ds[j.Dataset]
		if !fetchBound(j) || d.StorageBps <= 0 || j.Items <= 0 {
			continue
		}
		sum += math.Max(0, j.EpochS-j.MissBytes/d.StorageBps-j.StepS/math.Max(j.Batches, 1))
		items += j.Items
	}
	if items == 0 {
		return 0
	}
	return sum / items
}

// JobPlan is one job's row of a plan.
type JobPlan struct {
	Job, Dataset string
	// EpochS is measured; EpochSPredicted is predicted under the split.
	EpochS, EpochSPredicted float64
	CachedBytes, KneeBytes  float64
	// SecondsSavedPerGiB is how much one more GiB of cache would shorten
	// the job's epoch now (at its dataset's current allocation).
	SecondsSavedPerGiB float64
	// EpochSNow is the model's epoch at the current allocation.
	EpochSNow float64
}

// Plan is a split of the memory and what it predicts.
type Plan struct {
	Jobs  []JobPlan
	Split map[string]float64
	// Saving is the predicted fall of the jobs' summed epoch times against
	// the current allocation (0.1 = 10% shorter).
	Saving float64
}

// Split plans the memory. Datasets are planned as a whole: several jobs
// reading one dataset share its cache, so a unit goes where the sum of its
// jobs' savings is largest.
func Split(in Input) Plan {
	margin := in.Margin
	if margin <= 0 {
		margin = DefaultMargin
	}
	unit := in.Unit
	if unit <= 0 {
		unit = math.Min(GiB, in.Memory/128)
	}
	hit := HitCost(in.Jobs, in.Datasets)
	models := make([]Model, len(in.Jobs))
	type group struct {
		name        string
		bytes, knee float64
		ranks       int
		jobs        []int
	}
	groups := map[string]*group{}
	for x, j := range in.Jobs {
		d := in.Datasets[j.Dataset]
		models[x] = Fit(j, d, hit)
		g := groups[j.Dataset]
		if g == nil {
			g = &group{name: j.Dataset, bytes: d.Bytes}
			groups[j.Dataset] = g
		}
		g.knee = math.Max(g.knee, models[x].Knee(margin))
		g.ranks += max(j.Ranks, 1)
		g.jobs = append(g.jobs, x)
	}
	order := make([]*group, 0, len(groups))
	totalRanks := 0
	for _, g := range groups {
		order = append(order, g)
		totalRanks += g.ranks
	}
	slices.SortFunc(order, func(a, b *group) int { return cmp.Compare(a.name, b.name) })
	epochs := func(g *group, c float64) (s float64) {
		for _, x := range g.jobs {
			s += models[x].Epoch(c)
		}
		return s
	}

	// The floor: min(proportional share, knee). Shares are proportional to
	// the ranks (GPUs) each dataset's jobs run, as Synergy's fair share is.
	alloc := map[string]float64{}
	left := in.Memory
	for _, g := range order {
		prop := math.Min(g.bytes, in.Memory*float64(g.ranks)/float64(max(totalRanks, 1)))
		alloc[g.name] = math.Min(prop, g.knee)
		left -= alloc[g.name]
	}
	// Greedy: each unit to the dataset saving the most seconds per byte, up
	// to its knee. Ties go to the first by name, so plans are reproducible.
	for left > 0 {
		var best *group
		var bestRate, bestStep float64
		for _, g := range order {
			step := math.Min(math.Min(unit, left), g.knee-alloc[g.name])
			if step <= 0 {
				continue
			}
			rate := (epochs(g, alloc[g.name]) - epochs(g, alloc[g.name]+step)) / step
			if rate > bestRate {
				best, bestRate, bestStep = g, rate, step
			}
		}
		if best == nil {
			break
		}
		alloc[best.name] += bestStep
		left -= bestStep
	}
	// Every job is at its knee: what is left saves nothing by the model, so
	// it goes where it is still some use (room below the dataset's size),
	// in proportion to that room.
	var room float64
	for _, g := range order {
		room += math.Max(0, g.bytes-alloc[g.name])
	}
	if left > 0 && room > 0 {
		give := math.Min(left, room)
		for _, g := range order {
			alloc[g.name] += give * math.Max(0, g.bytes-alloc[g.name]) / room
		}
	}

	p := Plan{Split: map[string]float64{}}
	var now, planned float64
	for _, g := range order {
		p.Split[g.name] = math.Floor(alloc[g.name])
	}
	for x, j := range in.Jobs {
		m, d := models[x], in.Datasets[j.Dataset]
		cur := d.Current
		row := JobPlan{Job: j.Name, Dataset: j.Dataset, EpochS: j.EpochS, CachedBytes: d.Cached,
			KneeBytes: math.Floor(m.Knee(margin)), EpochSPredicted: m.Epoch(p.Split[j.Dataset]), EpochSNow: m.Epoch(cur)}
		if step := math.Min(unit, math.Max(0, d.Bytes-cur)); step > 0 {
			row.SecondsSavedPerGiB = (m.Epoch(cur) - m.Epoch(cur+step)) / step * GiB
		}
		now += row.EpochSNow
		planned += row.EpochSPredicted
		p.Jobs = append(p.Jobs, row)
	}
	if now > 0 {
		p.Saving = 1 - planned/now
	}
	return p
}
