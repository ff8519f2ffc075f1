package split

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"stallfree/api"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time          { return c.t }
func (c *clock) advance(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock                   { return &clock{t: time.Unix(1000, 0)} }
func bookOn(c *clock) *Book              { b := NewBook(); b.now = c.now; return b }
func meterOn(c *clock) *Meter            { m := NewMeter(); m.now = c.now; return m }
func approx(a, b float64) bool           { return a-b < 1e-9 && b-a < 1e-9 }

// A rank's epoch is what it reported between the window's opening and the
// epoch's end, with the storage bytes its dataset read meanwhile; a job's
// figures are the mean of its ranks', its epochs the least any rank did.
func TestBookEpochs(t *testing.T) {
	c := newClock()
	b := bookOn(c)
	b.Add(Report{Job: "", WaitS: 5, Batches: 1}, 0) // no job: nothing to plan
	b.Add(Report{Job: "j", Dataset: "d", Rank: 0}, 100)
	b.Add(Report{Job: "j", Dataset: "d", Rank: 0, WaitS: 1, StepS: 2, Batches: 10, Items: 100}, 150)
	b.Add(Report{Job: "j", Dataset: "d", Rank: 0, WaitS: 1, StepS: 2, Batches: 10, Items: 100, EpochEnd: true}, 300)
	b.Add(Report{Job: "j", Dataset: "d", Rank: 1}, 120)
	js := b.Jobs()
	if len(js) != 1 || js[0].Job != "j" || js[0].Ranks != 2 || js[0].Epochs != 0 {
		t.Fatalf("jobs %+v; want j with 2 ranks, rank 1 not done yet", js)
	}
	if l := js[0].Last; !approx(l.WaitS, 2) || !approx(l.StepS, 4) || l.Batches != 20 || l.Items != 200 || l.MissBytes != 200 {
		t.Fatalf("last epoch %+v; want rank 0's: 2 s waiting, 4 s stepping, 20 batches, 200 items, 200 bytes read", l)
	}
	b.Add(Report{Job: "j", Dataset: "d", Rank: 1, WaitS: 4, StepS: 2, Batches: 20, Items: 200, EpochEnd: true}, 400)
	// Rank 0's second epoch opens at its first end (300).
	b.Add(Report{Job: "j", Dataset: "d", Rank: 0, WaitS: 1, StepS: 1, Batches: 20, Items: 200, EpochEnd: true}, 350)
	js = b.Jobs()
	l := js[0].Last
	if js[0].Epochs != 1 || !approx(l.WaitS, 2.5) || !approx(l.StepS, 1.5) || l.Batches != 20 || l.MissBytes != 280 {
		t.Fatalf("%+v; want 1 epoch each at least, means of the last epochs, the larger window's 280 bytes", js[0])
	}
	if !approx(l.Seconds(), 4) {
		t.Fatalf("epoch seconds %g", l.Seconds())
	}
	// An end with no batches is no epoch; a job moved to another dataset
	// starts afresh; a silent job is forgotten.
	b.Add(Report{Job: "j", Dataset: "d", Rank: 0, EpochEnd: true}, 360)
	if js = b.Jobs(); js[0].Epochs != 1 {
		t.Fatalf("an empty epoch was counted: %+v", js[0])
	}
	b.Add(Report{Job: "j", Dataset: "e", Rank: 0}, 0)
	if js = b.Jobs(); js[0].Dataset != "e" || js[0].Ranks != 1 || js[0].Last.Batches != 0 {
		t.Fatalf("a job on another dataset kept its old figures: %+v", js[0])
	}
	c.advance(11 * time.Minute)
	if js = b.Jobs(); len(js) != 0 {
		t.Fatalf("a job silent for 11 minutes is still listed: %+v", js)
	}
}

// Busy time is the union of the reads' spells: overlapping reads count
// once, idle gaps not at all.
func TestMeterBusyTime(t *testing.T) {
	c := newClock()
	m := meterOn(c)
	if m.Rate(7) != 0 {
		t.Fatal("a rate before any read")
	}
	m.Start(7)
	c.advance(time.Second)
	m.Start(7) // overlaps the first
	c.advance(time.Second)
	m.Done(7, 1000)
	c.advance(time.Second)
	m.Done(7, 3000)
	c.advance(10 * time.Second) // idle
	m.Start(7)
	c.advance(time.Second)
	if bytes, busy := m.Read(7); bytes != 4000 || busy != 4*time.Second {
		t.Fatalf("read %d bytes in %v busy; want 4000 in 4s (the current spell included)", bytes, busy)
	}
	m.Done(7, 1000)
	if r := m.Rate(7); !approx(r, 5000.0/4) {
		t.Fatalf("rate %g; want 1250 B/s", r)
	}
	m.Forget(7)
	if b, _ := m.Read(7); b != 0 {
		t.Fatal("forgotten dataset still counted")
	}
}

type target struct {
	mu      sync.Mutex
	epochs  uint64
	saving  float64
	plans   int
	applied chan api.Plan
}

func (t *target) EpochsDone() uint64 { t.mu.Lock(); defer t.mu.Unlock(); return t.epochs }
func (t *target) SplitPlan(context.Context) (api.Plan, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.plans++
	return api.Plan{Jobs: []api.PlanJob{{Job: "j"}}, Split: map[string]uint64{"d": uint64(t.plans)}, PredictedSaving: t.saving}, nil
}
func (t *target) ApplySplit(_ context.Context, p api.Plan) error { t.applied <- p; return nil }
func (t *target) set(epochs uint64, saving float64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.epochs, t.saving = epochs, saving
}
func (t *target) planned() int { t.mu.Lock(); defer t.mu.Unlock(); return t.plans }

func await(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out awaiting %s", what)
		}
	}
}

// Auto plans every Every epochs and applies only a plan predicting more
// than MinSaving.
func TestAutoAppliesOnlyWorthwhilePlans(t *testing.T) {
	tg := &target{applied: make(chan api.Plan, 10)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { Auto(ctx, tg, AutoConfig{Every: 2, Poll: time.Millisecond}); close(done) }()
	defer func() { cancel(); <-done }()

	tg.set(1, 0.5) // one epoch: too early
	time.Sleep(20 * time.Millisecond)
	if tg.planned() != 0 {
		t.Fatal("planned after one epoch")
	}
	tg.set(2, 0.5)
	p := <-tg.applied
	if p.Split["d"] != 1 {
		t.Fatalf("applied %+v; want the first plan", p)
	}
	tg.set(3, 0.5) // one more epoch: not yet the next plan
	time.Sleep(20 * time.Millisecond)
	if tg.planned() != 1 {
		t.Fatalf("%d plans after 3 epochs; want 1", tg.planned())
	}
	tg.set(4, 0.04) // a plan under 5%: made, not applied
	await(t, "the second plan", func() bool { return tg.planned() == 2 })
	tg.set(6, 0.06)
	p = <-tg.applied
	if p.Split["d"] != 3 || len(tg.applied) != 0 {
		t.Fatalf("applied %+v (%d more queued); want the third plan only", p, len(tg.applied))
	}
}

// Reports cannot grow the book without bound: past MaxJobs a new job takes
// the place of the one idle longest, past MaxRanks a new rank that of the
// rank idle longest.
func TestBookBoundsJobsAndRanks(t *testing.T) {
	c := newClock()
	b := bookOn(c)
	b.MaxJobs, b.MaxRanks = 3, 2
	for _, name := range []string{"a", "b", "c"} {
		b.Add(Report{Job: name, Batches: 1}, 0)
		c.advance(time.Second)
	}
	b.Add(Report{Job: "a", Batches: 1}, 0) // a is busy again; b is now the idlest
	c.advance(time.Second)
	b.Add(Report{Job: "d", Batches: 1}, 0)
	var names []string
	for _, j := range b.Jobs() {
		names = append(names, j.Job)
	}
	if strings.Join(names, ",") != "a,c,d" {
		t.Fatalf("jobs kept: %v; want a,c,d (b idle longest)", names)
	}
	for r := range 5 {
		b.Add(Report{Job: "d", Rank: r, Batches: 1}, 0)
		c.advance(time.Second)
	}
	for _, j := range b.Jobs() {
		if j.Job == "d" && j.Ranks != 2 {
			t.Fatalf("job d keeps %d ranks; want 2", j.Ranks)
		}
	}
}

// Ranks over all jobs are bounded too (MaxRanksTotal): a new rank past it
// takes the place of the idlest other job, and of its own job's idlest rank
// when there is no other. The per-job bounds alone let 1024 jobs of 4096
// ranks grow the book to tens of GB.
func TestBookBoundsRanksOverAllJobs(t *testing.T) {
	c := newClock()
	b := bookOn(c)
	b.MaxRanksTotal = 5
	ranksOf := func() map[string]int {
		out := map[string]int{}
		for _, j := range b.Jobs() {
			out[j.Job] = j.Ranks
		}
		return out
	}
	for r := range 3 {
		b.Add(Report{Job: "old", Rank: r, Batches: 1}, 0)
		c.advance(time.Second)
	}
	for r := range 2 {
		b.Add(Report{Job: "mid", Rank: r, Batches: 1}, 0)
		c.advance(time.Second)
	}
	b.Add(Report{Job: "new", Rank: 0, Batches: 1}, 0) // a sixth rank: old, the idlest, goes whole
	if got := ranksOf(); len(got) != 2 || got["mid"] != 2 || got["new"] != 1 {
		t.Fatalf("ranks kept: %v; want mid 2, new 1", got)
	}
	for r := 1; r < 8; r++ {
		c.advance(time.Second)
		b.Add(Report{Job: "new", Rank: r, Batches: 1}, 0)
	}
	if got := ranksOf(); len(got) != 1 || got["new"] != 5 {
		t.Fatalf("ranks kept: %v; want new's 5 latest only", got)
	}
	b.mu.Lock()
	counted := b.ranks
	b.mu.Unlock()
	if counted != 5 {
		t.Fatalf("the book counts %d ranks; holds 5", counted)
	}
}

// A job's stall: each rank's reports over the last 60 s, merged across the
// nodes that heard them (the latest report wins), with the rank whose step
// time is over 1.2× the median marked.
func TestStallWindowsAndStragglers(t *testing.T) {
	c := newClock()
	b := bookOn(c)
	b.Add(Report{Job: "j", Rank: 0, WaitS: 100, StepS: 100, Batches: 100, Items: 100}, 0) // falls out of the window
	c.advance(2 * StallWindow)
	for r, step := range []float64{0.1, 0.1, 0.25} {
		// 10 batches of 32: step and wait as the rank measured them.
		b.Add(Report{Job: "j", Rank: r, WaitS: 0.5, StepS: 10 * step, Batches: 10, Items: 320}, 0)
	}
	c.advance(3 * time.Second)
	here := b.Recent("j", "n1")
	if len(here) != 3 || here[0].WaitS != 0.5 || here[0].Batches != 10 || here[0].Node != "n1" {
		t.Fatalf("recent: %+v", here)
	}
	// Another node heard rank 1 earlier, with other figures: the later wins.
	old := RankWindow{Rank: 1, Node: "n2", WaitS: 9, StepS: 1, Batches: 1, Items: 1, LastUnixMs: here[1].LastUnixMs - 5000}
	got := MergeStall(append(here, old), c.now())
	if len(got) != 3 {
		t.Fatalf("merged: %+v", got)
	}
	for r, want := range []struct {
		share, step float64
		straggler   bool
	}{{0.5 / 1.5, 0.1, false}, {0.5 / 1.5, 0.1, false}, {0.5 / 3, 0.25, true}} {
		g := got[r]
		if g.Rank != r || g.Node != "n1" || !approx(g.WaitShare, want.share) || !approx(g.StepS, want.step) || g.Straggler != want.straggler ||
			!approx(g.LastReportS, 3) {
			t.Errorf("rank %d: %+v; want share %.3f, step %.2f, straggler %v, last 3 s", r, g, want.share, want.step, want.straggler)
		}
	}
	if !approx(got[2].SamplesPerS, 320/3.0) {
		t.Errorf("samples/s %v", got[2].SamplesPerS)
	}
	if m := b.ActiveJobs("n1", 2); len(m) != 0 {
		t.Errorf("3 ranks exported under a bound of 2 series: %v", m)
	}
	if m := b.ActiveJobs("n1", 3); len(m["j"]) != 3 {
		t.Errorf("active jobs: %v", m)
	}
}
