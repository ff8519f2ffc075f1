package split

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"stallfree/api"
)

// scripted is a Target whose plans the test sets; it counts the loop's
// looks at the epoch count, so a test can wait for looks instead of time.
type scripted struct {
	mu       sync.Mutex
	epochs   uint64
	looks    int
	plan     api.Plan
	planErr  error
	applyErr error
	plans    int
	applied  []api.Plan
}

func (s *scripted) EpochsDone() uint64 { s.mu.Lock(); defer s.mu.Unlock(); s.looks++; return s.epochs }
func (s *scripted) SplitPlan(context.Context) (api.Plan, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.plans++
	return s.plan, s.planErr
}
func (s *scripted) ApplySplit(_ context.Context, p api.Plan) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.applyErr != nil {
		return s.applyErr
	}
	s.applied = append(s.applied, p)
	return nil
}

// set changes the target, then waits until the loop has looked twice more
// (so at least once after the change).
func (s *scripted) set(t *testing.T, f func(*scripted)) {
	t.Helper()
	s.mu.Lock()
	f(s)
	seen := s.looks
	s.mu.Unlock()
	await(t, "two more looks", func() bool { s.mu.Lock(); defer s.mu.Unlock(); return s.looks >= seen+2 })
}

func (s *scripted) counts() (plans, applied int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.plans, len(s.applied)
}

func runAuto(t *testing.T, tg Target, cfg AutoConfig) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	done := make(chan struct{})
	go func() { Auto(ctx, tg, cfg); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// The defaults: a plan every 2 epochs, applied only above a 5% saving; a
// plan for no job is never applied; a failed plan or apply waits for the
// next turn.
func TestAutoDefaultsAndFailures(t *testing.T) {
	tg := &scripted{plan: api.Plan{Jobs: []api.PlanJob{{Job: "j"}}, PredictedSaving: 0.05}}
	var log lockedBuffer
	runAuto(t, tg, AutoConfig{Poll: time.Millisecond, Log: slog.New(slog.NewTextHandler(&log, nil))})
	tg.set(t, func(s *scripted) { s.epochs = 1 })
	if p, _ := tg.counts(); p != 0 {
		t.Fatal("planned after one epoch")
	}
	tg.set(t, func(s *scripted) { s.epochs = 2 })
	if p, a := tg.counts(); p != 1 || a != 0 {
		t.Fatalf("a saving of exactly 5%%: %d plans, %d applied", p, a)
	}
	tg.set(t, func(s *scripted) { s.epochs, s.plan.PredictedSaving, s.planErr = 4, 0.5, errors.New("no reports") })
	tg.set(t, func(s *scripted) { s.planErr = nil })
	if p, a := tg.counts(); p != 2 || a != 0 {
		t.Fatalf("after a failed plan: %d plans, %d applied; want no retry before the next turn", p, a)
	}
	tg.set(t, func(s *scripted) { s.epochs, s.applyErr = 6, errors.New("no leader") })
	if p, a := tg.counts(); p != 3 || a != 0 {
		t.Fatalf("a failed apply: %d plans, %d applied", p, a)
	}
	if l := log.String(); !strings.Contains(l, "auto-split: applying") || strings.Contains(l, "auto-split: applied") {
		t.Fatalf("a failed apply logged %q", l)
	}
	tg.set(t, func(s *scripted) { s.epochs, s.applyErr, s.plan.Jobs = 8, nil, nil })
	if p, a := tg.counts(); p != 4 || a != 0 {
		t.Fatalf("a plan of no jobs: %d plans, %d applied", p, a)
	}
	tg.set(t, func(s *scripted) { s.epochs, s.plan.Jobs = 10, []api.PlanJob{{Job: "j"}} })
	if p, a := tg.counts(); p != 5 || a != 1 {
		t.Fatalf("a worthwhile plan: %d plans, %d applied", p, a)
	}
	if !strings.Contains(log.String(), "auto-split: applied") {
		t.Fatalf("an applied plan not logged: %q", log.String())
	}
}

type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}
func (l *lockedBuffer) String() string { l.mu.Lock(); defer l.mu.Unlock(); return l.b.String() }

// Poll 0 is the default period (a second): the loop looks at the epoch
// count.
func TestAutoDefaultPoll(t *testing.T) {
	tg := &scripted{}
	runAuto(t, tg, AutoConfig{})
	await(t, "a look at the default period", func() bool { tg.mu.Lock(); defer tg.mu.Unlock(); return tg.looks > 0 })
}

// A custom threshold: a plan at it is kept, one above applied.
func TestAutoMinSaving(t *testing.T) {
	tg := &scripted{plan: api.Plan{Jobs: []api.PlanJob{{Job: "j"}}, PredictedSaving: 0.2}}
	runAuto(t, tg, AutoConfig{Every: 1, MinSaving: 0.2, Poll: time.Millisecond})
	tg.set(t, func(s *scripted) { s.epochs = 1 })
	if p, a := tg.counts(); p != 1 || a != 0 {
		t.Fatalf("at the threshold: %d plans, %d applied", p, a)
	}
	tg.set(t, func(s *scripted) { s.epochs, s.plan.PredictedSaving = 2, 0.21 })
	if p, a := tg.counts(); p != 2 || a != 1 {
		t.Fatalf("above it: %d plans, %d applied", p, a)
	}
}

// A rank silent for longer than the stall window is left out of a job's
// recent windows; an unknown job has none.
func TestRecentLeavesOutSilentRanks(t *testing.T) {
	c := newClock()
	b := bookOn(c)
	b.Add(Report{Job: "j", Rank: 0, WaitS: 1, StepS: 1, Batches: 1}, 0)
	c.advance(StallWindow / 2)
	b.Add(Report{Job: "j", Rank: 1, WaitS: 2, StepS: 2, Batches: 2}, 0)
	if got := b.Recent("j", "n"); len(got) != 2 || got[0].Rank != 0 || got[1].Batches != 2 {
		t.Fatalf("recent: %+v", got)
	}
	c.advance(StallWindow/2 + time.Second)
	if got := b.Recent("j", "n"); len(got) != 1 || got[0].Rank != 1 {
		t.Fatalf("rank 0 silent past the window: %+v", got)
	}
	c.advance(StallWindow)
	if got := b.Recent("j", "n"); len(got) != 0 {
		t.Fatalf("every rank silent: %+v", got)
	}
	if got := b.ActiveJobs("n", 10); len(got) != 0 {
		t.Fatalf("active: %+v", got)
	}
	if b.Recent("nobody", "n") != nil {
		t.Fatal("an unknown job has windows")
	}
}

// The median of an even count is the mean of the middle two.
func TestMedian(t *testing.T) {
	for _, c := range []struct {
		v    []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{4, 1}, 2.5}, {[]float64{5, 1, 3}, 3}, {[]float64{9, 1, 2, 4}, 3}} {
		if got := median(c.v); got != c.want {
			t.Errorf("median(%v) = %v; want %v", c.v, got, c.want)
		}
	}
}

// An epoch's end with no batch in the window counts no epoch; a job silent
// for exactly MaxAge is kept, a moment longer forgotten.
func TestEmptyEpochsAndMaxAge(t *testing.T) {
	c := newClock()
	b := bookOn(c)
	b.MaxAge = time.Minute
	b.Add(Report{Job: "j", Dataset: "d", EpochEnd: true}, 100)
	if js := b.Jobs(); len(js) != 1 || js[0].Epochs != 0 || js[0].Last != (Epoch{}) {
		t.Fatalf("an empty epoch counted: %+v", js)
	}
	c.advance(time.Minute)
	if js := b.Jobs(); len(js) != 1 {
		t.Fatalf("silent for exactly MaxAge: %+v", js)
	}
	c.advance(time.Nanosecond)
	if js := b.Jobs(); len(js) != 0 {
		t.Fatalf("silent past MaxAge: %+v", js)
	}
}

// Bytes read in no measurable time give no rate (not an infinite one).
func TestRateOfNoTime(t *testing.T) {
	m := meterOn(newClock())
	m.Start(1)
	m.Done(1, 100)
	if r := m.Rate(1); r != 0 {
		t.Fatalf("rate %v", r)
	}
}

// The stall window's edges: a rank keeps its last keptReports reports; a
// report or a rank exactly StallWindow old still counts, a moment older
// not; a window of no time or no batches has no share and no step time.
func TestStallWindowEdges(t *testing.T) {
	c := newClock()
	b := bookOn(c)
	for range keptReports + 50 {
		b.Add(Report{Job: "many", Batches: 1, StepS: 1}, 0)
	}
	if n := len(b.jobs["many"].ranks[0].recent); n != keptReports {
		t.Fatalf("%d reports kept; want keptReports", n)
	}
	b.Add(Report{Job: "j", Rank: 0, WaitS: 1, StepS: 1, Batches: 1, Items: 1}, 0)
	c.advance(StallWindow)
	b.Add(Report{Job: "j", Rank: 1, WaitS: 2, StepS: 2, Batches: 2}, 0)
	if n := len(b.jobs["j"].ranks[0].recent); n != 1 {
		t.Fatalf("rank 0 keeps %d reports", n)
	}
	b.Add(Report{Job: "j", Rank: 0, WaitS: 4, StepS: 4, Batches: 4}, 0) // the first is exactly StallWindow old
	if n := len(b.jobs["j"].ranks[0].recent); n != 2 {
		t.Fatalf("a report exactly StallWindow old was dropped: %d kept", n)
	}
	got := b.Recent("j", "n")
	if len(got) != 2 || got[0].Batches != 5 || got[0].Items != 1 {
		t.Fatalf("exactly StallWindow after the first report: %+v", got)
	}
	c.advance(StallWindow)
	if got := b.Recent("j", "n"); len(got) != 2 || got[0].Batches != 4 || got[1].Batches != 2 {
		t.Fatalf("exactly StallWindow after the last reports: %+v", got)
	}
	if a := b.ActiveJobs("n", 10); len(a["j"]) != 2 {
		t.Fatalf("a job seen exactly StallWindow ago is not active: %v", a)
	}
	c.advance(time.Nanosecond)
	if got := b.Recent("j", "n"); len(got) != 0 {
		t.Fatalf("a moment later: %+v", got)
	}
	ms := c.now().UnixMilli()
	stall := MergeStall([]RankWindow{{Rank: 0, LastUnixMs: ms}, {Rank: 1, WaitS: 1, Items: 4, LastUnixMs: ms},
		{Rank: 2, StepS: 1, Batches: 1, LastUnixMs: ms}, {Rank: 3, StepS: 3, Batches: 1, LastUnixMs: ms}}, c.now())
	if s := stall[0]; s.WaitShare != 0 || s.SamplesPerS != 0 || s.StepS != 0 || s.Straggler {
		t.Fatalf("a window of no time: %+v", s)
	}
	if s := stall[1]; s.WaitShare != 1 || s.SamplesPerS != 4 || s.StepS != 0 || s.Straggler {
		t.Fatalf("a window of no batches: %+v", s)
	}
	// The median is over the ranks with batches only (1 and 3: 2): rank 3 is
	// a straggler, rank 2 is not.
	if stall[2].Straggler || !stall[3].Straggler {
		t.Fatalf("stragglers: %+v", stall)
	}
	// Exactly 1.2× the median is no straggler; a median of 0 marks nobody.
	stall = MergeStall([]RankWindow{{Rank: 0, StepS: 1, Batches: 1}, {Rank: 1, StepS: 1, Batches: 1}, {Rank: 2, StepS: 1.2, Batches: 1}}, c.now())
	if stall[2].StepS != 1.2 || stall[2].Straggler {
		t.Fatalf("exactly 1.2x the median: %+v", stall[2])
	}
	stall = MergeStall([]RankWindow{{Rank: 0, Batches: 1}, {Rank: 1, Batches: 1}, {Rank: 2, StepS: 1, Batches: 1}}, c.now())
	if stall[2].Straggler {
		t.Fatalf("a median of 0: %+v", stall[2])
	}
}
