package split

import (
	"slices"
	"sort"
	"time"

	"stallfree/api"
)

// The per-rank view of a job's stall (docs/api.md, "Seeing the stall"):
// what each rank's stall meter reported over the last StallWindow, here and
// on the other nodes, merged into one answer.

// StallWindow is how far back per-rank figures look.
const StallWindow = 60 * time.Second

// StragglerFactor: a rank whose step time is over this many times the
// median of its job's ranks is a straggler.
const StragglerFactor = 1.2

// keptReports bounds the reports a rank keeps for its window (a stall
// meter reports every few batches; older ones than StallWindow go anyway).
const keptReports = 128

type recentReport struct {
	at           time.Time
	waitS, stepS float64
	batches      uint64
	items        uint64
}

// RankWindow is what one node heard from one rank over the window: the
// sums of its reports and when the last one came. It travels between nodes
// (the internal stall route) to be merged.
type RankWindow struct {
	Rank    int     `json:"rank"`
	Node    string  `json:"node"`
	WaitS   float64 `json:"wait_s"`
	StepS   float64 `json:"step_s"`
	Batches uint64  `json:"batches"`
	Items   uint64  `json:"items"`
	// LastUnixMs is when the rank last reported, in Unix milliseconds.
	LastUnixMs int64 `json:"last_unix_ms"`
}

// remember adds r to the rank's recent reports. Caller holds the book's mu.
func (rk *rank) remember(r Report, now time.Time) {
	rk.recent = append(rk.recent, recentReport{at: now, waitS: r.WaitS, stepS: r.StepS, batches: r.Batches, items: r.Items})
	cut := 0
	for cut < len(rk.recent) && (now.Sub(rk.recent[cut].at) > StallWindow || len(rk.recent)-cut > keptReports) {
		cut++
	}
	rk.recent = slices.Delete(rk.recent, 0, cut)
}

// Recent is what this book heard from each rank of job over the window,
// as node node, by rank.
func (b *Book) Recent(job, node string) []RankWindow {
	b.mu.Lock()
	defer b.mu.Unlock()
	j := b.jobs[job]
	if j == nil {
		return nil
	}
	now := b.now()
	out := []RankWindow{}
	for r, rk := range j.ranks {
		w := RankWindow{Rank: r, Node: node, LastUnixMs: rk.seen.UnixMilli()}
		if now.Sub(rk.seen) > StallWindow {
			continue
		}
		for _, rep := range rk.recent {
			if now.Sub(rep.at) > StallWindow {
				continue
			}
			w.WaitS += rep.waitS
			w.StepS += rep.stepS
			w.Batches += rep.batches
			w.Items += rep.items
		}
		out = append(out, w)
	}
	sort.Slice(out, func(a, c int) bool { return out[a].Rank < out[c].Rank })
	return out
}

// ActiveJobs lists the jobs that reported within the window, the most
// recent first, with their ranks' windows: what /metrics exports, at most
// maxSeries (job, rank) pairs, so idle jobs drop out first.
func (b *Book) ActiveJobs(node string, maxSeries int) map[string][]RankWindow {
	b.mu.Lock()
	type seen struct {
		name string
		at   time.Time
	}
	var jobs []seen
	now := b.now()
	for name, j := range b.jobs {
		if at := j.lastSeen(); now.Sub(at) <= StallWindow {
			jobs = append(jobs, seen{name, at})
		}
	}
	b.mu.Unlock()
	sort.Slice(jobs, func(a, c int) bool { return jobs[a].at.After(jobs[c].at) })
	out := map[string][]RankWindow{}
	n := 0
	for _, j := range jobs {
		ws := b.Recent(j.name, node)
		if n+len(ws) > maxSeries {
			break
		}
		out[j.name] = ws
		n += len(ws)
	}
	return out
}

// MergeStall merges the windows of one job that several nodes heard (a
// rank reports to one node at a time; where two heard it, the latest
// report wins) into the job's "stall" answer, by rank, with stragglers
// marked.
func MergeStall(windows []RankWindow, now time.Time) []api.RankStall {
	latest := map[int]RankWindow{}
	for _, w := range windows {
		if cur, ok := latest[w.Rank]; !ok || w.LastUnixMs > cur.LastUnixMs {
			latest[w.Rank] = w
		}
	}
	out := make([]api.RankStall, 0, len(latest))
	var steps []float64
	for _, w := range latest {
		rs := api.RankStall{Rank: w.Rank, Node: w.Node,
			LastReportS: max(0, now.Sub(time.UnixMilli(w.LastUnixMs)).Seconds())}
		if total := w.WaitS + w.StepS; total > 0 {
			rs.WaitShare = w.WaitS / total
			rs.SamplesPerS = float64(w.Items) / total
		}
		if w.Batches > 0 {
			rs.StepS = w.StepS / float64(w.Batches)
			steps = append(steps, rs.StepS)
		}
		out = append(out, rs)
	}
	if med := median(steps); med > 0 {
		for i := range out {
			out[i].Straggler = out[i].StepS > StragglerFactor*med
		}
	}
	sort.Slice(out, func(a, c int) bool { return out[a].Rank < out[c].Rank })
	return out
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(v))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
