// Package split keeps what a node learns for the memory split by
// sensitivity (docs/api.md, Synergy): what each training job's stall meter
// reports, epoch by epoch, and how fast each dataset's storage delivers. The
// planner package turns these into a plan; Auto re-plans as epochs end.
package split

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// Report is one stall-meter report: since the rank's last report, the loop
// waited WaitS for batches and held them StepS, over Batches batches of
// Items items. EpochEnd closes the rank's epoch.
type Report struct {
	Job, Dataset string
	Rank         int
	WaitS, StepS float64
	Batches      uint64
	Items        uint64
	EpochEnd     bool
}

// Epoch is one rank's complete epoch as reported, with the bytes its
// dataset read from storage meanwhile.
type Epoch struct {
	WaitS, StepS float64
	Batches      uint64
	Items        uint64
	MissBytes    uint64
}

// Seconds is the epoch's length as the loop saw it.
func (e Epoch) Seconds() float64 { return e.WaitS + e.StepS }

type window struct {
	Epoch
	open      bool
	srcBytes0 uint64 // the dataset's storage bytes when the window opened
}

type rank struct {
	cur    window
	last   *Epoch
	epochs uint64
	seen   time.Time
	recent []recentReport // the last StallWindow's reports (recent.go)
}

type job struct {
	dataset string
	ranks   map[int]*rank
}

// Book holds the reports of every job that reported to this node. Safe for
// concurrent use.
type Book struct {
	mu   sync.Mutex
	jobs map[string]*job
	// MaxAge forgets a job none of whose ranks reported for that long
	// (finished or moved); 0: ten minutes.
	MaxAge time.Duration
	// MaxJobs bounds the jobs kept (0: DefaultMaxJobs); a new job past it
	// takes the place of the one idle longest. Ranks per job are bounded by
	// MaxRanks alike, and ranks over all jobs by MaxRanksTotal (a rank keeps
	// up to keptReports reports, ~8 KiB: the per-job bounds alone allowed
	// 4M ranks, tens of GB), so reports cannot grow the book without bound.
	MaxJobs, MaxRanks, MaxRanksTotal int
	now                              func() time.Time
	ranks                            int // over all jobs
}

// The book's default bounds.
const (
	DefaultMaxJobs       = 1024
	DefaultMaxRanks      = 4096
	DefaultMaxRanksTotal = 1 << 16
)

// NewBook returns an empty book on the wall clock.
func NewBook() *Book { return &Book{jobs: map[string]*job{}, now: time.Now} }

// Add records r. srcBytes is what r's dataset has read from storage on this
// node so far: a rank's epoch owns the difference between its window's
// opening and its end. The first report of a rank opens its window (the
// stall meter sends an empty one as it starts), and each epoch's end opens
// the next.
func (b *Book) Add(r Report, srcBytes uint64) {
	if r.Job == "" {
		return // nothing to plan for
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	j := b.jobs[r.Job]
	if j == nil || (r.Dataset != "" && j.dataset != r.Dataset) {
		if j == nil && len(b.jobs) >= bound(b.MaxJobs, DefaultMaxJobs) {
			b.dropJob(b.idlest(""))
		}
		b.dropJob(r.Job) // another dataset under the name: a new job
		j = &job{dataset: r.Dataset, ranks: map[int]*rank{}}
		b.jobs[r.Job] = j
	}
	rk := j.ranks[r.Rank]
	if rk == nil {
		if len(j.ranks) >= bound(b.MaxRanks, DefaultMaxRanks) {
			b.dropRank(j, idlestRank(j))
		}
		for b.ranks >= bound(b.MaxRanksTotal, DefaultMaxRanksTotal) {
			if other := b.idlest(r.Job); other != "" {
				b.dropJob(other)
			} else {
				b.dropRank(j, idlestRank(j))
			}
		}
		rk = &rank{}
		j.ranks[r.Rank] = rk
		b.ranks++
	}
	rk.seen = b.now()
	rk.remember(r, rk.seen)
	if !rk.cur.open {
		rk.cur = window{open: true, srcBytes0: srcBytes}
	}
	rk.cur.WaitS += r.WaitS
	rk.cur.StepS += r.StepS
	rk.cur.Batches += r.Batches
	rk.cur.Items += r.Items
	if r.EpochEnd && rk.cur.Batches > 0 {
		e := rk.cur.Epoch
		e.MissBytes = srcBytes - min(srcBytes, rk.cur.srcBytes0)
		rk.last = &e
		rk.epochs++
		rk.cur = window{open: true, srcBytes0: srcBytes}
	}
}

func bound(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// idlest is the job whose last report is the oldest, but for except ("":
// none of them). Caller holds b.mu.
func (b *Book) idlest(except string) string {
	var (
		name string
		when time.Time
	)
	for n, j := range b.jobs {
		if n == except {
			continue
		}
		if seen := j.lastSeen(); name == "" || seen.Before(when) {
			name, when = n, seen
		}
	}
	return name
}

// dropJob forgets a job and its ranks (none: nothing). Caller holds b.mu.
func (b *Book) dropJob(name string) {
	if j, ok := b.jobs[name]; ok {
		b.ranks -= len(j.ranks)
		delete(b.jobs, name)
	}
}

// dropRank forgets rank r of j. Caller holds b.mu.
func (b *Book) dropRank(j *job, r int) {
	if _, ok := j.ranks[r]; ok {
		delete(j.ranks, r)
		b.ranks--
	}
}

func (j *job) lastSeen() time.Time {
	var t time.Time
	for _, rk := range j.ranks {
		if rk.seen.After(t) {
			t = rk.seen
		}
	}
	return t
}

// idlestRank is the rank of j that reported longest ago.
func idlestRank(j *job) int {
	first, r, when := true, 0, time.Time{}
	for k, rk := range j.ranks {
		if first || rk.seen.Before(when) {
			first, r, when = false, k, rk.seen
		}
	}
	return r
}

// JobStats is what the book knows of one job.
type JobStats struct {
	Job, Dataset string
	Ranks        int
	// Epochs is how many epochs every reporting rank has completed (the
	// least among them).
	Epochs uint64
	// Last is the mean of the ranks' last complete epochs, MissBytes the
	// largest any rank's window saw (each sees the whole dataset's reads);
	// zero when no rank has completed one.
	Last Epoch
	// Seen is when a rank of it last reported.
	Seen time.Time
}

// Jobs lists the jobs that reported recently, by name.
func (b *Book) Jobs() []JobStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	maxAge := b.MaxAge
	if maxAge <= 0 {
		maxAge = 10 * time.Minute
	}
	now := b.now()
	var out []JobStats
	for _, name := range slices.Sorted(maps.Keys(b.jobs)) {
		j := b.jobs[name]
		st := JobStats{Job: name, Dataset: j.dataset, Ranks: len(j.ranks)}
		done := 0
		for _, rk := range j.ranks {
			if rk.seen.After(st.Seen) {
				st.Seen = rk.seen
			}
			if rk.last == nil {
				continue
			}
			done++
			st.Last.WaitS += rk.last.WaitS
			st.Last.StepS += rk.last.StepS
			st.Last.Batches += rk.last.Batches
			st.Last.Items += rk.last.Items
			st.Last.MissBytes = max(st.Last.MissBytes, rk.last.MissBytes)
		}
		if now.Sub(st.Seen) > maxAge {
			b.dropJob(name)
			continue
		}
		if done > 0 {
			st.Last.WaitS /= float64(done)
			st.Last.StepS /= float64(done)
			st.Last.Batches /= uint64(done)
			st.Last.Items /= uint64(done)
			st.Epochs = ^uint64(0)
			for _, rk := range j.ranks {
				st.Epochs = min(st.Epochs, rk.epochs)
			}
		}
		out = append(out, st)
	}
	return out
}
