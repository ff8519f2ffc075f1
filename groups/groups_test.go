package groups

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/catalog"
)

// fakeHost is a one-node catalog with a memory budget, counting claims.
type fakeHost struct {
	mu      sync.Mutex
	groups  map[string]*catalog.Group
	budget  uint64
	claimed uint64
	version uint64
}

func newFakeHost(budget uint64) *fakeHost {
	return &fakeHost{groups: map[string]*catalog.Group{}, budget: budget}
}

func (h *fakeHost) Name() string { return "self" }
func (h *fakeHost) Group(name string) (*catalog.Group, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	g, ok := h.groups[name]
	return g, ok
}
func (h *fakeHost) Groups() []*catalog.Group {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []*catalog.Group
	for _, g := range h.groups {
		out = append(out, g)
	}
	slices.SortFunc(out, func(a, b *catalog.Group) int { return strings.Compare(a.Name, b.Name) })
	return out
}
func (h *fakeHost) AwaitCatalog(_ context.Context, cond func() bool) bool { return cond() }
func (h *fakeHost) AppliedIndex() uint64                                  { return 0 }
func (h *fakeHost) AwaitApplied(context.Context, uint64) bool             { return true }
func (h *fakeHost) PutGroup(_ context.Context, g catalog.Group) (*catalog.Group, bool, error) {
	if g.Dataset != "ds" {
		return nil, false, fmt.Errorf("%w: dataset %q", catalog.ErrNotFound, g.Dataset)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	h.version++
	g.Version, g.Samples = h.version, 40
	h.groups[g.Name] = &g
	return &g, true, nil
}
func (h *fakeHost) DeleteGroup(_ context.Context, name string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.groups, name)
	return nil
}
func (h *fakeHost) GroupOwner(string) (string, bool) { return "", true }
func (h *fakeHost) ClaimMemory(n uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.claimed+n > h.budget {
		return false
	}
	h.claimed += n
	return true
}
func (h *fakeHost) UnclaimMemory(n uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.claimed -= n
}
func (h *fakeHost) held() uint64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.claimed
}

func newService(t *testing.T, budget uint64, jobs, window int) (*Service, *fakeHost) {
	t.Helper()
	h := newFakeHost(budget)
	s := New(h, Config{Timeout: time.Hour, MaxBatchBytes: 1 << 20})
	t.Cleanup(s.Close)
	w := window
	if _, _, err := s.Put(context.Background(), "g", api.GroupSpec{Dataset: "ds", Seed: 1, BatchSize: 4, Jobs: jobs, Window: &w}); err != nil {
		t.Fatal(err)
	}
	return s, h
}

func TestProducerCoversEveryBatchOnceAndSpreadsTakeovers(t *testing.T) {
	const jobs, batches = 4, 40
	none := []Detached(nil)
	for b := range batches {
		if p := Producer(jobs, batches, none, uint64(b)); p != b%jobs {
			t.Fatalf("batch %d: producer %d, want b mod J = %d", b, p, b%jobs)
		}
	}
	// Job 1 detached from position 10, job 3 from 20: every batch from
	// there has an attached producer, and the taken-over share is spread
	// over both attached jobs.
	det := []Detached{{Job: 1, From: 10}, {Job: 3, From: 20}}
	counts := map[int]int{}
	for pos := uint64(0); pos < 3*batches; pos++ {
		p := Producer(jobs, batches, det, pos)
		base := int(pos%batches) % jobs
		switch {
		case base == 1 && pos >= 10, base == 3 && pos >= 20:
			if p != 0 && p != 2 {
				t.Fatalf("pos %d: taken over by %d, want an attached job", pos, p)
			}
			counts[p]++
		case p != base:
			t.Fatalf("pos %d: producer %d, want %d (not taken over)", pos, p, base)
		}
	}
	if counts[0] == 0 || counts[2] == 0 || max(counts[0], counts[2])-min(counts[0], counts[2]) > 2 {
		t.Fatalf("takeovers spread %v, want about even over jobs 0 and 2", counts)
	}
	if p := Producer(2, 10, []Detached{{0, 0}, {1, 0}}, 3); p != -1 {
		t.Fatalf("every job detached: producer %d, want -1", p)
	}
}

func TestStagedBatchIsServedToEveryJobThenDropped(t *testing.T) {
	s, h := newService(t, 1<<20, 3, 4)
	ctx := context.Background()
	if created, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, []byte("first"), time.Second); err != nil || !created {
		t.Fatalf("put: %v %v", created, err)
	}
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 1, Index: 0}, []byte("other"), time.Second); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("other bytes: %v, want a conflict", err)
	}
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, []byte("first"), time.Second); err != nil {
		t.Fatalf("same bytes again: %v", err)
	}
	for j := 1; j < 3; j++ {
		data, _, err := s.Get(ctx, Batch{Group: "g", Job: j, Index: 0}, 0)
		if err != nil || string(data) != "first" {
			t.Fatalf("job %d reads %q, %v", j, data, err)
		}
	}
	info, _ := s.LocalInfo("g")
	if info.StagedBatches != 0 || h.held() != 0 {
		t.Fatalf("after every job read it: %d staged, %d bytes claimed; want none", info.StagedBatches, h.held())
	}
	// A late PUT of a dropped batch is acknowledged, not staged again.
	if created, err := s.PutBatch(ctx, Batch{Group: "g", Job: 2, Index: 0}, []byte("late"), time.Second); err != nil || created {
		t.Fatalf("late put: %v %v", created, err)
	}
	if info, _ := s.LocalInfo("g"); info.StagedBatches != 0 || info.Jobs[0].Prepared != 1 || info.Jobs[1].Served != 1 {
		t.Fatalf("info %+v", info)
	}
}

func TestWaitingReaderGetsTheBatchWhenStaged(t *testing.T) {
	s, _ := newService(t, 1<<20, 2, 4)
	ctx := context.Background()
	got := make(chan string, 1)
	go func() {
		data, _, err := s.Get(ctx, Batch{Group: "g", Job: 1, Index: 0}, time.Minute)
		got <- fmt.Sprintf("%s %v", data, err)
	}()
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, []byte("b0"), time.Second); err != nil {
		t.Fatal(err)
	}
	if g := <-got; g != "b0 <nil>" {
		t.Fatalf("waiting reader got %q", g)
	}
	// The producer asking for its own batch is told at once.
	if _, p, err := s.Get(ctx, Batch{Group: "g", Job: 0, Index: 2}, time.Minute); !errors.Is(err, ErrNotStaged) || p != 0 {
		t.Fatalf("producer's own batch: producer %d, %v", p, err)
	}
}

func TestProducerPastTheBoundWaitsThenFails(t *testing.T) {
	s, h := newService(t, 1<<20, 2, 1) // bound: W × J = 2 batches
	ctx := context.Background()
	for j := range 2 {
		if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: j, Index: j}, []byte("xxxx"), time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 2}, []byte("xxxx"), 50*time.Millisecond); !errors.Is(err, ErrFull) {
		t.Fatalf("past the bound: %v, want ErrFull", err)
	}
	info, _ := s.LocalInfo("g")
	if info.StagedBatches != 2 || info.Jobs[0].Batch != 0 || info.Jobs[0].Prepared != 1 || info.Jobs[1].Detached || h.held() != 8 {
		t.Fatalf("a refused put changed the group: %+v, %d claimed", info, h.held())
	}
	// Once job 1 reads batch 0, the waiting producer gets in.
	done := make(chan error, 1)
	go func() {
		_, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 2}, []byte("xxxx"), time.Minute)
		done <- err
	}()
	if _, _, err := s.Get(ctx, Batch{Group: "g", Job: 1, Index: 0}, 0); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiting producer: %v", err)
	}
}

func TestMemoryBudgetBoundsStaging(t *testing.T) {
	s, _ := newService(t, 6, 2, 4)
	ctx := context.Background()
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, []byte("xxxx"), time.Second); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 2}, []byte("xxxx"), 20*time.Millisecond); !errors.Is(err, ErrFull) {
		t.Fatalf("past the node's memory: %v, want ErrFull", err)
	}
}

func TestLaggingJobIsDetachedAndItsShareTakenOver(t *testing.T) {
	s, h := newService(t, 1<<20, 3, 2)
	ctx := context.Background()
	put := func(j, b int, data string) {
		t.Helper()
		if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: j, Index: b}, []byte(data), time.Second); err != nil {
			t.Fatalf("job %d puts %d: %v", j, b, err)
		}
	}
	get := func(j, b int) {
		t.Helper()
		if _, _, err := s.Get(ctx, Batch{Group: "g", Job: j, Index: b}, 0); err != nil {
			t.Fatalf("job %d gets %d: %v", j, b, err)
		}
	}
	// Batches 0..2, each made by its job and read by the two others.
	for j := range 3 {
		put(j, j, "x")
	}
	for j := range 3 {
		get(j, (j+1)%3)
		get(j, (j+2)%3)
	}
	if info, _ := s.LocalInfo("g"); info.StagedBatches != 0 {
		t.Fatalf("batches read by all still staged: %d", info.StagedBatches)
	}
	// Jobs 0 and 1 move on; job 2 stays at 2: at 6 it is more than W=2 behind.
	put(0, 3, "b3")
	put(1, 4, "b4")
	put(0, 6, "b6")
	info, _ := s.LocalInfo("g")
	if j2 := info.Jobs[2]; !j2.Detached || j2.From == nil || *j2.From != 3 || info.Jobs[1].Detached {
		t.Fatalf("jobs %+v; want job 2 alone detached, from 3 (one past its last batch)", info.Jobs)
	}
	if _, _, err := s.Get(ctx, Batch{Group: "g", Job: 2, Index: 3}, 0); !errors.Is(err, ErrDetached) {
		t.Fatalf("detached job reads: %v, want ErrDetached", err)
	}
	// Batch 5 was job 2's; job 1 (round-robin over 0 and 1) prepares it now,
	// and is told so at once when it asks.
	if p := Producer(3, 10, []Detached{{Job: 2, From: 3}}, 5); p != 1 {
		t.Fatalf("producer of 5 after the takeover: %d, want 1", p)
	}
	if _, p, err := s.Get(ctx, Batch{Group: "g", Job: 1, Index: 5}, time.Minute); !errors.Is(err, ErrNotStaged) || p != 1 {
		t.Fatalf("taker asks for batch 5: producer %d, %v", p, err)
	}
	get(1, 3) // complete without job 2: dropped
	if info, _ := s.LocalInfo("g"); info.StagedBatches != 2 || h.held() != 4 {
		t.Fatalf("staged %d (%d bytes claimed), want batches 4 and 6 only", info.StagedBatches, h.held())
	}
}

func TestSilentJobIsDetachedAfterTheTimeoutAndWaitersWake(t *testing.T) {
	s, _ := newService(t, 1<<20, 2, 4)
	ctx := context.Background()
	res := make(chan error, 1)
	go func() {
		// Job 0 waits for job 1's batch 1; job 1 never comes.
		_, _, err := s.Get(ctx, Batch{Group: "g", Job: 0, Index: 1}, time.Minute)
		res <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for info, _ := s.LocalInfo("g"); !info.Jobs[0].Seen; info, _ = s.LocalInfo("g") {
		if time.Now().After(deadline) {
			t.Fatal("job 0 never asked")
		}
		time.Sleep(time.Millisecond)
	}
	for {
		s.tick(time.Now().Add(2 * time.Hour)) // past the timeout for anyone not waiting
		info, _ := s.LocalInfo("g")
		if info.Jobs[1].Detached {
			if info.Jobs[0].Detached {
				t.Fatal("a waiting job was detached as silent")
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("job 1 never detached")
		}
		time.Sleep(time.Millisecond)
	}
	if err := <-res; !errors.Is(err, ErrNotStaged) {
		t.Fatalf("the waiter: %v, want told it prepares the batch now", err)
	}
}

func TestRedefiningAGroupWithAttachedJobsConflicts(t *testing.T) {
	s, _ := newService(t, 1<<20, 2, 4)
	ctx := context.Background()
	w := 4
	same := api.GroupSpec{Dataset: "ds", Seed: 1, BatchSize: 4, Jobs: 2, Window: &w}
	if _, created, err := s.Put(ctx, "g", same); err != nil || created {
		t.Fatalf("same spec again: created %v, %v", created, err)
	}
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, []byte("x"), time.Second); err != nil {
		t.Fatal(err)
	}
	other := same
	other.Seed = 2
	if _, _, err := s.Put(ctx, "g", other); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("other spec with job 0 attached: %v", err)
	}
	for _, bad := range []api.GroupSpec{{Dataset: "ds", BatchSize: 4, Jobs: 0}, {Dataset: "ds", BatchSize: 0, Jobs: 1},
		{Dataset: "ds", BatchSize: 4, Jobs: 1, Window: new(int)}} {
		if _, _, err := s.Put(ctx, "h", bad); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("%+v: %v, want ErrBadRequest", bad, err)
		}
	}
	if _, _, err := s.Put(ctx, "h", api.GroupSpec{Dataset: "gone", BatchSize: 4, Jobs: 1}); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("unknown dataset: %v", err)
	}
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 2, Index: 0}, []byte("x"), 0); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("job out of range: %v", err)
	}
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 10}, []byte("x"), 0); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("batch out of range (10 batches of 4 in 40): %v", err)
	}
	if got := slices.Collect(func(yield func(string) bool) {
		for _, g := range s.host.Groups() {
			yield(g.Name)
		}
	}); !slices.Equal(got, []string{"g"}) {
		t.Fatalf("groups %v; want only g (no refused definition)", got)
	}
}

// The attack of issue 46: a read of a batch far ahead (another epoch, or
// past the newest staged batch plus the window) used to make its job the
// "fastest" and detach every other one. It is refused with a conflict and
// moves no position; reads in reach still work.
func TestFarReadsAreRefusedAndMoveNothing(t *testing.T) {
	s, _ := newService(t, 1<<20, 3, 4)
	ctx := context.Background()
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, []byte("b0"), time.Second); err != nil {
		t.Fatal(err)
	}
	for _, j := range []int{1, 2} {
		if _, _, err := s.Get(ctx, Batch{Group: "g", Job: j, Index: 0}, 0); err != nil {
			t.Fatalf("job %d, batch 0: %v", j, err)
		}
	}
	before, _ := s.LocalInfo("g")
	for _, far := range []Batch{
		{Group: "g", Job: 0, Epoch: 1000, Index: 0}, // another epoch
		{Group: "g", Job: 0, Epoch: 2, Index: 0},    // past the next
		{Group: "g", Job: 0, Epoch: 0, Index: 5},    // newest staged 0 + W 4 < 5
	} {
		if _, _, err := s.Get(ctx, far, 0); !errors.Is(err, catalog.ErrConflict) {
			t.Fatalf("read of epoch %d batch %d: %v; want a conflict", far.Epoch, far.Index, err)
		}
	}
	for _, e := range []uint64{2, 1000} { // a producer far ahead, too
		if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 1, Epoch: e, Index: 1}, []byte("x"), 0); !errors.Is(err, catalog.ErrConflict) {
			t.Fatalf("put of epoch %d: %v; want a conflict", e, err)
		}
	}
	after, _ := s.LocalInfo("g")
	for j := range after.Jobs {
		if after.Jobs[j].Detached || after.Jobs[j].Epoch != before.Jobs[j].Epoch || after.Jobs[j].Batch != before.Jobs[j].Batch {
			t.Fatalf("job %d moved or detached: before %+v, after %+v", j, before.Jobs[j], after.Jobs[j])
		}
	}
	// In reach: batch 4 (newest 0 + W) and the next epoch's start.
	if _, _, err := s.Get(ctx, Batch{Group: "g", Job: 1, Index: 4}, 0); !errors.Is(err, ErrNotStaged) {
		t.Fatalf("batch 4: %v; want not staged (in reach)", err)
	}
	if _, _, err := s.Get(ctx, Batch{Group: "g", Job: 2, Epoch: 1, Index: 0}, 0); errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("the next epoch's first batch: %v", err)
	}
}

// In shared memory a staged batch is one file, its path what readers on
// this host get; a second PUT compares against it; once every job has read
// it the file stays Linger and is then removed, even while a reader still
// has it open (its pages go when the reader lets go or dies); a restarted
// service removes what its last run left.
func TestBatchesInSharedMemory(t *testing.T) {
	dir := t.TempDir()
	h := newFakeHost(1 << 20)
	s := New(h, Config{Timeout: time.Hour, MaxBatchBytes: 1 << 20, ShmDir: dir, Linger: time.Minute})
	t.Cleanup(s.Close)
	w := 4
	ctx := context.Background()
	if _, _, err := s.Put(ctx, "g", api.GroupSpec{Dataset: "ds", Seed: 1, BatchSize: 4, Jobs: 2, Window: &w}); err != nil {
		t.Fatal(err)
	}
	data := []byte("a staged batch")
	if created, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, data, time.Second); err != nil || !created {
		t.Fatalf("put: %v %v", created, err)
	}
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, []byte("other bytes"), time.Second); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("other bytes: %v", err)
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 1 {
		t.Fatalf("files after one batch and a refused PUT: %v", files)
	}
	st, _, err := s.GetStaged(ctx, Batch{Group: "g", Job: 1, Index: 0}, 0)
	if err != nil || st.Path == "" || st.Data != nil || st.Size != int64(len(data)) {
		t.Fatalf("staged: %+v %v", st, err)
	}
	if got, err := st.Bytes(); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the staged file's bytes: %q %v", got, err)
	}
	held, err := os.Open(st.Path) // a reader maps it
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	if got, _ := io.ReadAll(held); !bytes.Equal(got, data) {
		t.Fatalf("the file holds %q", got)
	}
	if info, _ := s.LocalInfo("g"); info.StagedBatches != 0 || h.held() != 0 {
		t.Fatalf("after both jobs: %d staged, %d bytes claimed", info.StagedBatches, h.held())
	}
	s.tick(time.Now())
	if _, err := os.Stat(st.Path); err != nil {
		t.Fatalf("the file went before its linger: %v", err)
	}
	s.tick(time.Now().Add(2 * time.Minute))
	if _, err := os.Stat(st.Path); !os.IsNotExist(err) {
		t.Fatalf("the file outlived its linger: %v", err)
	}
	// A file a dead run left is removed by the next one; another node's stays.
	mine, other := filepath.Join(dir, s.shmPrefix()+"g-9-x"), filepath.Join(dir, "stallfree-othernode-g-9-x")
	for _, p := range []string{mine, other} {
		os.WriteFile(p, data, 0o600)
	}
	New(h, Config{ShmDir: dir}).Close()
	if _, err := os.Stat(mine); !os.IsNotExist(err) {
		t.Fatalf("a stale file of this node stayed: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("another node's file was removed: %v", err)
	}
}

// A group's version is its definition's in this node's catalog; a group it
// does not show has none (a relayed read of a deleted group asked it, and a
// nil definition was read).
func TestVersionOfAGroup(t *testing.T) {
	s, h := newService(t, 1<<20, 2, 4)
	if v, ok := s.Version("g"); !ok || v != h.version {
		t.Fatalf("version of g: %d %v; want %d", v, ok, h.version)
	}
	if err := s.host.DeleteGroup(context.Background(), "g"); err != nil {
		t.Fatal(err)
	}
	if v, ok := s.Version("g"); ok || v != 0 {
		t.Fatalf("version of a deleted group: %d %v", v, ok)
	}
}

// A dropped batch's file goes about when its linger ends, by the service's
// own clock (not up to a second later): its memory is what the next batches
// reuse. A relayed batch kept for the host's other jobs is not such a file:
// it outlives the linger, as those jobs may read it a window later.
func TestTheClockRemovesADroppedFileAfterItsLingerAndHostCopiesStay(t *testing.T) {
	dir := t.TempDir()
	s := New(newFakeHost(1<<20), Config{Timeout: time.Hour, MaxBatchBytes: 1 << 20, ShmDir: dir, Linger: 20 * time.Millisecond})
	t.Cleanup(s.Close)
	ctx := context.Background()
	if _, _, err := s.Put(ctx, "g", api.GroupSpec{Dataset: "ds", Seed: 1, BatchSize: 4, Jobs: 2}); err != nil {
		t.Fatal(err)
	}
	copied, ok := s.KeepHostCopy("other", 1, 0, 0, []byte("a relayed batch"))
	if !ok || copied.Path == "" {
		t.Fatalf("host copy: %+v %v", copied, ok)
	}
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, []byte("a staged batch"), time.Second); err != nil {
		t.Fatal(err)
	}
	st, _, err := s.GetStaged(ctx, Batch{Group: "g", Job: 1, Index: 0}, 0)
	if err != nil || st.Path == "" {
		t.Fatalf("staged: %+v %v", st, err)
	}
	deadline := time.Now().Add(10 * time.Second) // the clock ticks every 10 ms here (TestTheClocksPeriod)
	for {
		if _, err := os.Stat(st.Path); os.IsNotExist(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the dropped batch's file is still there 10 s after its linger of 20 ms")
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Looked up before and opened after: gone, a dropped batch (404, the
	// asker makes it).
	if _, err := st.Open(); !errors.Is(err, ErrGone) || !errors.Is(err, ErrNotStaged) {
		t.Fatalf("opening the let-go file: %v", err)
	}
	if _, err := st.Bytes(); !errors.Is(err, ErrGone) {
		t.Fatalf("reading the let-go file: %v", err)
	}
	if got, ok := s.HostCopy("other", 1, 0, 0); !ok || got.Path != copied.Path {
		t.Fatalf("the host copy went with the linger: %+v %v", got, ok)
	}
	if _, err := os.Stat(copied.Path); err != nil {
		t.Fatalf("the host copy's file: %v", err)
	}
	s.tick(time.Now().Add(hostCopyLife + time.Second))
	if _, ok := s.HostCopy("other", 1, 0, 0); ok {
		t.Fatal("the host copy outlived hostCopyLife")
	}
}

func TestTheClocksPeriod(t *testing.T) {
	for _, c := range []struct {
		timeout, linger, want time.Duration
	}{
		{time.Hour, time.Hour, time.Second},
		{time.Hour, DefaultLinger, DefaultLinger / 2},
		{time.Hour, 20 * time.Millisecond, 10 * time.Millisecond},
		{400 * time.Millisecond, time.Minute, 50 * time.Millisecond},
		{40 * time.Millisecond, time.Minute, 10 * time.Millisecond},
	} {
		if got := (Config{Timeout: c.timeout, Linger: c.linger}).tickEvery(); got != c.want {
			t.Errorf("timeout %v, linger %v: every %v, want %v", c.timeout, c.linger, got, c.want)
		}
	}
}

// Past the bound on relayed copies the oldest go, not the newest batch: a
// group relaying more than the bound in a copy's life keeps copying. A
// batch over the bound itself is not kept; an evicted copy's file lingers
// as a dropped batch's does.
func TestHostCopiesPastTheBoundEvictTheOldest(t *testing.T) {
	dir := t.TempDir()
	s := New(newFakeHost(1<<20), Config{Timeout: time.Hour, ShmDir: dir, Linger: time.Minute, MaxHostCopyBytes: 100})
	t.Cleanup(s.Close)
	batch := bytes.Repeat([]byte("x"), 40)
	var kept []Staged
	for i := range 3 {
		c, ok := s.KeepHostCopy("g", 1, 0, i, batch)
		if !ok {
			t.Fatalf("copy %d not kept", i)
		}
		kept = append(kept, c)
	}
	if _, ok := s.HostCopy("g", 1, 0, 0); ok {
		t.Error("the oldest copy was kept past the bound")
	}
	for i := 1; i < 3; i++ {
		if got, ok := s.HostCopy("g", 1, 0, i); !ok || got.Path != kept[i].Path {
			t.Errorf("copy %d: %+v %v", i, got, ok)
		}
	}
	s.mu.Lock()
	held := s.copyBytes
	s.mu.Unlock()
	if held != 80 {
		t.Errorf("%d bytes of copies held, want 80", held)
	}
	if _, err := os.Stat(kept[0].Path); err != nil {
		t.Errorf("the evicted copy's file went before its linger: %v", err)
	}
	if _, ok := s.KeepHostCopy("g", 1, 0, 9, bytes.Repeat([]byte("x"), 101)); ok {
		t.Error("a batch over the bound was kept")
	}
	if got, ok := s.HostCopy("g", 1, 0, 1); !ok || got.Path != kept[1].Path {
		t.Error("a batch over the bound evicted the others")
	}
	// Filling the bound exactly evicts nothing; past it, no more than the
	// room needs; a batch the size of the bound is kept, alone.
	if _, ok := s.KeepHostCopy("g", 1, 0, 3, batch[:20]); !ok {
		t.Fatal("a copy that fills the bound exactly was not kept")
	}
	for i := 1; i <= 3; i++ {
		if _, ok := s.HostCopy("g", 1, 0, i); !ok {
			t.Errorf("copy %d went when the bound was just filled", i)
		}
	}
	if _, ok := s.KeepHostCopy("g", 1, 0, 4, batch); !ok { // evicting copy 1 leaves the bound filled exactly
		t.Fatal("copy 4 not kept")
	}
	if _, ok := s.HostCopy("g", 1, 0, 1); ok {
		t.Error("copy 1, the oldest, stayed past the bound")
	}
	if _, ok := s.HostCopy("g", 1, 0, 2); !ok {
		t.Error("copy 2 went, though evicting copy 1 made room")
	}
	if _, ok := s.KeepHostCopy("g", 1, 0, 5, bytes.Repeat([]byte("y"), 100)); !ok {
		t.Error("a batch the size of the bound was not kept")
	}
	for i := 2; i <= 4; i++ {
		if _, ok := s.HostCopy("g", 1, 0, i); ok {
			t.Errorf("copy %d stayed beside a batch the size of the bound", i)
		}
	}
	s.tick(time.Now().Add(2 * time.Minute))
	if _, err := os.Stat(kept[0].Path); !os.IsNotExist(err) {
		t.Errorf("the evicted copy's file outlived its linger: %v", err)
	}
}

// A file named by a descriptor number (a handed-over batch's) is opened
// only while it is still the batch's: another inode under that number is
// the batch let go, whatever the error.
func TestAStagedFileUnderAReusedNumberIsGone(t *testing.T) {
	f, err := os.CreateTemp(t.TempDir(), "batch")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString("a batch")
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	path := fmt.Sprintf("/proc/self/fd/%d", f.Fd())
	if got, err := (Staged{Path: path, Ino: st.Ino, Dev: st.Dev}).Bytes(); err != nil || string(got) != "a batch" {
		t.Fatalf("the file itself: %q %v", got, err)
	}
	if _, err := (Staged{Path: path, Ino: st.Ino + 1, Dev: st.Dev}).Open(); !errors.Is(err, ErrGone) {
		t.Fatalf("another inode under the number: %v", err)
	}
	if _, err := (Staged{Path: path, Ino: st.Ino, Dev: st.Dev + 1}).Open(); !errors.Is(err, ErrGone) {
		t.Fatalf("the same inode on another device under the number: %v", err)
	}
}

// Defining a group and asking for it start no clock: a loader does both when
// it is made, and its job may then build a model for longer than the timeout
// before it reads a batch. The clock starts at the group's first batch
// request, for every job.
func TestDefiningOrAskingStartsNoClock(t *testing.T) {
	s, _ := newService(t, 1<<20, 2, 4) // defined (Put), and asked for through it
	ctx := bounded(t)
	if _, err := s.LocalInfo("g"); err != nil {
		t.Fatal(err)
	}
	s.tick(time.Now().Add(2 * time.Hour)) // past the timeout since both
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, []byte("abcd"), time.Second); err != nil {
		t.Fatalf("the first batch after a long setup: %v", err)
	}
	info, err := s.LocalInfo("g")
	if err != nil {
		t.Fatal(err)
	}
	if info.Jobs[0].Detached || info.Jobs[1].Detached || !info.Jobs[0].Seen || info.Jobs[1].Seen {
		t.Fatalf("jobs after the first batch: %+v", info.Jobs)
	}
	// From there on a silent job is detached as before.
	s.tick(time.Now().Add(2 * time.Hour))
	if info, _ := s.LocalInfo("g"); !info.Jobs[1].Detached {
		t.Fatalf("job 1 silent past the timeout since the first batch: %+v", info.Jobs[1])
	}
}

// A job that says it is alive is not detached for silence, whatever the
// others do; one that stops saying so is, as before. Before the group's
// first batch request there is no clock and nothing is made; a detached job
// is told so; a job index out of range is a bad request.
func TestAliveHoldsOffTheSilenceTimeout(t *testing.T) {
	s, _ := newService(t, 1<<20, 2, 4)
	ctx := bounded(t)
	if err := s.Alive("g", 1); err != nil {
		t.Fatalf("before the first batch: %v", err)
	}
	s.mu.Lock()
	_, made := s.stages["g"]
	s.mu.Unlock()
	if made {
		t.Fatal("a liveness report made the group's stage")
	}
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, []byte("abcd"), time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Millisecond) // job 1's report comes strictly after job 0's batch
	if err := s.Alive("g", 1); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	last0, last1 := s.stages["g"].jobs[0].last, s.stages["g"].jobs[1].last
	s.mu.Unlock()
	if !last1.After(last0) {
		t.Fatalf("job 1's report at %v, not after job 0's batch at %v", last1, last0)
	}
	s.tick(last1.Add(s.cfg.Timeout)) // past the timeout for job 0's batch, exactly it for job 1's report
	if info, _ := s.LocalInfo("g"); !info.Jobs[0].Detached || info.Jobs[1].Detached {
		t.Fatalf("job 0 silent, job 1 alive: %+v", info.Jobs)
	}
	s.tick(time.Now().Add(2 * s.cfg.Timeout))
	info, _ := s.LocalInfo("g")
	if !info.Jobs[1].Detached {
		t.Fatalf("job 1 silent past the timeout since its report: %+v", info.Jobs[1])
	}
	if err := s.Alive("g", 1); !errors.Is(err, ErrDetached) {
		t.Fatalf("a detached job: %v, want ErrDetached", err)
	}
	if err := s.Alive("g", 2); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("job 2 of 2: %v, want ErrBadRequest", err)
	}
	if err := s.Alive("nope", 0); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("no such group: %v, want not found", err)
	}
	if info.TimeoutS != s.cfg.Timeout.Seconds() {
		t.Fatalf("timeout_s %v, want %v", info.TimeoutS, s.cfg.Timeout.Seconds())
	}
}
