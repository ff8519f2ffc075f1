package catchup

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

type fakeSource struct {
	target  atomic.Uint64
	failing atomic.Bool
	asked   atomic.Int32
	applied atomic.Uint64
	local   atomic.Uint64 // 0: not the leader
}

func (f *fakeSource) Target(context.Context) (uint64, error) {
	f.asked.Add(1)
	if f.failing.Load() {
		return 0, errors.New("no raft leader known")
	}
	return f.target.Load(), nil
}

func (f *fakeSource) AppliedIndex() uint64 { return f.applied.Load() }

func (f *fakeSource) HasApplied(index uint64) bool { return f.applied.Load() >= index }

func (f *fakeSource) LocalTarget() (uint64, bool) { return f.local.Load(), f.local.Load() > 0 }

func TestGateOpensAtTheLeadersIndexAndStaysOpen(t *testing.T) {
	src := &fakeSource{}
	src.failing.Store(true)
	src.target.Store(40)
	src.applied.Store(3)
	g := New(src)
	if ok, why := g.Ready(); ok || !strings.Contains(why, "not yet compared") {
		t.Fatalf("before any target: %v %q", ok, why)
	}
	done := make(chan struct{})
	go func() { g.Run(t.Context(), time.Millisecond); close(done) }()
	for src.asked.Load() < 3 {
		time.Sleep(time.Millisecond)
	}
	if ok, why := g.Ready(); ok || !strings.Contains(why, "no raft leader known") {
		t.Fatalf("while the leader cannot be asked: %v %q", ok, why)
	}
	src.failing.Store(false)
	<-done
	if ok, why := g.Ready(); ok || !strings.Contains(why, "applied 3 of 40") {
		t.Fatalf("behind the target: %v %q", ok, why)
	}
	src.applied.Store(39)
	if ok, _ := g.Ready(); ok {
		t.Fatal("open one index short of the target")
	}
	src.applied.Store(40)
	if ok, why := g.Ready(); !ok {
		t.Fatalf("at the target: %q", why)
	}
	// Learnt once: the leader moving on later does not close it again.
	src.target.Store(100)
	if ok, _ := g.Ready(); !ok {
		t.Fatal("closed again after opening")
	}
}

func TestRunStopsWithItsContext(t *testing.T) {
	src := &fakeSource{}
	src.failing.Store(true)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { New(src).Run(ctx, time.Millisecond); close(done) }()
	cancel()
	<-done
}

// A leader's target needs no network: it opens as soon as it has applied
// its own log, without waiting for Run.
func TestLeaderOpensWithoutRun(t *testing.T) {
	src := &fakeSource{}
	src.failing.Store(true)
	src.applied.Store(5)
	g := New(src)
	if ok, _ := g.Ready(); ok {
		t.Fatal("open with no target at all")
	}
	src.local.Store(7)
	if ok, why := g.Ready(); ok || !strings.Contains(why, "applied 5 of 7") {
		t.Fatalf("leader behind its log: %v %q", ok, why)
	}
	src.applied.Store(7)
	if ok, why := g.Ready(); !ok {
		t.Fatalf("leader that applied its log: %q", why)
	}
}
