package groups

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/internal/testutil"
	"stallfree/relay"
)

// bounded is a context no test waits past (a mutant that stops a wait from
// ending fails instead of hanging).
func bounded(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// remoteHost is fakeHost whose groups are owned by another node at owner.
type remoteHost struct {
	*fakeHost
	owner   string
	applied uint64
	mu      sync.Mutex
	awaited []uint64
}

func (h *remoteHost) GroupOwner(string) (string, bool) { return h.owner, false }
func (h *remoteHost) AppliedIndex() uint64             { return h.applied }
func (h *remoteHost) AwaitApplied(_ context.Context, idx uint64) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.awaited = append(h.awaited, idx)
	return true
}

// A node that does not own a group asks its owner, saying what it has
// applied; the owner's refusal is its status, no answer a 503. A relayed
// request (after > 0) is answered here once the catalog caught up.
func TestInfoAsksTheOwner(t *testing.T) {
	var mu sync.Mutex
	var header http.Header
	status := http.StatusOK
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		header = r.Header.Clone()
		if status != http.StatusOK {
			w.WriteHeader(status)
			json.NewEncoder(w).Encode(map[string]string{"error": "no such group"})
			return
		}
		json.NewEncoder(w).Encode(api.GroupInfo{Name: "g", Owner: "o", StagedBatches: 3})
	}))
	defer owner.Close()
	h := &remoteHost{fakeHost: newFakeHost(1 << 20), owner: strings.TrimPrefix(owner.URL, "http://"), applied: 42}
	s := New(h, Config{Timeout: time.Hour, Relay: relay.New("self", "")})
	t.Cleanup(s.Close)
	ctx := bounded(t)
	info, err := s.Info(ctx, "g", 0)
	if err != nil || info.Owner != "o" || info.StagedBatches != 3 {
		t.Fatalf("remote info: %+v %v", info, err)
	}
	if got := header.Get(api.HeaderApplied); got != "42" {
		t.Fatalf("applied index sent: %q", got)
	}
	mu.Lock()
	status = http.StatusNotFound
	mu.Unlock()
	if _, err := s.Info(ctx, "g", 0); !isStatus(err, http.StatusNotFound) {
		t.Fatalf("the owner's 404: %v", err)
	}
	owner.Close()
	if _, err := s.Info(ctx, "g", 0); !isStatus(err, http.StatusServiceUnavailable) {
		t.Fatalf("no owner: %v", err)
	}
	// Relayed here: answered from this node, after waiting for the index.
	w := 2
	if _, _, err := h.PutGroup(ctx, catalog.Group{Name: "g", Dataset: "ds", BatchSize: 4, Jobs: 2, Window: w}); err != nil {
		t.Fatal(err)
	}
	info, err = s.Info(ctx, "g", 7)
	if err != nil || info.Owner != "self" || len(info.Jobs) != 2 {
		t.Fatalf("relayed info: %+v %v", info, err)
	}
	if _, err := s.Info(ctx, "absent", 9); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("a group nobody defined: %v", err)
	}
	if _, _, err := s.Get(ctx, Batch{Group: "absent"}, 0); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("a batch of a group nobody defined: %v", err)
	}
	// With its owner gone, a group cannot be redefined: whether a job is
	// attached is the owner's to say.
	if _, _, err := s.Put(ctx, "g", api.GroupSpec{Dataset: "ds", Seed: 5, BatchSize: 4, Jobs: 2, Window: &w}); !isStatus(err, http.StatusServiceUnavailable) {
		t.Fatalf("redefining with the owner gone: %v", err)
	}
	if g, _ := h.Group("g"); g.Seed != 0 {
		t.Fatalf("redefined to seed %d without the owner", g.Seed)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.awaited) != 1 || h.awaited[0] != 9 {
		t.Fatalf("awaited indices %v; want only 9 (g was known, a client's request names none)", h.awaited)
	}
}

func isStatus(err error, status int) bool {
	e, ok := errors.AsType[*api.Error](err)
	return ok && e.Status == status
}

// List shows every group with its jobs not seen; Delete ends one, and the
// owner's next tick frees what it staged, its memory included, and wakes
// its waiters with not found.
func TestDeleteFreesTheStageAndWakesWaiters(t *testing.T) {
	s, h := newService(t, 1<<20, 2, 4)
	ctx := bounded(t)
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, []byte("abcd"), time.Second); err != nil {
		t.Fatal(err)
	}
	list := s.List()
	if len(list) != 1 || list[0].Name != "g" || len(list[0].Jobs) != 2 || list[0].Jobs[0].Seen || list[0].Batches != 10 {
		t.Fatalf("list: %+v", list)
	}
	if h.held() != 4 {
		t.Fatalf("held %d", h.held())
	}
	res := make(chan error, 1)
	go func() {
		_, p, err := s.Get(ctx, Batch{Group: "g", Job: 0, Index: 1}, 10*time.Second) // job 1 prepares it
		if p != -1 {
			err = fmt.Errorf("producer %d of a deleted group's batch (%v)", p, err)
		}
		res <- err
	}()
	testutil.Await(t, "the reader in flight", func() bool { info, _ := s.LocalInfo("g"); return info.Jobs[0].Batch == 1 })
	if err := s.Delete(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	if err := s.Delete(ctx, "g"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("deleting it again: %v", err)
	}
	s.tick(time.Now())
	if err := <-res; !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("a waiter on a deleted group: %v", err)
	}
	if h.held() != 0 {
		t.Fatalf("%d bytes still claimed", h.held())
	}
	if _, err := s.LocalInfo("g"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("info of a deleted group: %v", err)
	}
}

// A redefined group (a new version) starts a new stage: the old one's
// batches are freed on the next tick or the next request.
func TestRedefinitionStartsAnewStage(t *testing.T) {
	s, h := newService(t, 1<<20, 2, 4)
	ctx := bounded(t)
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, []byte("abcd"), time.Second); err != nil {
		t.Fatal(err)
	}
	w := 4
	if _, _, err := h.PutGroup(ctx, catalog.Group{Name: "g", Dataset: "ds", Seed: 9, BatchSize: 4, Jobs: 2, Window: w}); err != nil {
		t.Fatal(err)
	}
	info, err := s.LocalInfo("g")
	if err != nil || info.StagedBatches != 0 || info.Seed != 9 || h.held() != 0 {
		t.Fatalf("after redefinition: %+v %v, held %d", info, err, h.held())
	}
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, []byte("abcd"), time.Second); err != nil {
		t.Fatal(err)
	}
	if _, _, err := h.PutGroup(ctx, catalog.Group{Name: "g", Dataset: "ds", Seed: 10, BatchSize: 4, Jobs: 2, Window: w}); err != nil {
		t.Fatal(err)
	}
	s.tick(time.Now())
	if h.held() != 0 {
		t.Fatalf("the tick kept %d bytes of the old version", h.held())
	}
}

// A batch over --max-item-bytes is refused before anything; a late PUT of a
// batch every job already has is acknowledged and stages nothing.
func TestPutBatchBoundsAndLatePuts(t *testing.T) {
	s, h := newService(t, 1<<20, 2, 4)
	ctx := bounded(t)
	if s.MaxBatchBytes() != 1<<20 {
		t.Fatalf("max batch bytes %d", s.MaxBatchBytes())
	}
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, make([]byte, 1<<20+1), time.Second); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("one byte over: %v", err)
	}
	if created, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, make([]byte, 1<<20), time.Second); err != nil || !created {
		t.Fatalf("exactly the bound: %v %v", created, err)
	}
	if got, _, err := s.Get(ctx, Batch{Group: "g", Job: 1, Index: 0}, time.Second); err != nil || len(got) != 1<<20 {
		t.Fatalf("read: %d %v", len(got), err)
	}
	if h.held() != 0 {
		t.Fatalf("served to both, still %d bytes", h.held())
	}
	created, err := s.PutBatch(ctx, Batch{Group: "g", Job: 1, Index: 0}, []byte("late"), time.Second)
	if err != nil || created {
		t.Fatalf("a late PUT of a dropped batch: %v %v", created, err)
	}
	info, _ := s.LocalInfo("g")
	if info.StagedBatches != 0 || h.held() != 0 || info.Jobs[1].Prepared != 0 {
		t.Fatalf("a late PUT staged: %+v", info)
	}
	if _, p, err := s.Get(ctx, Batch{Group: "g", Job: 1, Index: 0}, 0); !errors.Is(err, ErrNotStaged) || p != -1 {
		t.Fatalf("a read of a dropped batch: %v (producer %d; nobody prepares it again)", err, p)
	}
	if _, _, err := s.Get(ctx, Batch{Group: "g", Job: 0, Epoch: maxEpoch + 1, Index: 0}, 0); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("an epoch past the bound: %v", err)
	}
	if _, _, err := s.Get(ctx, Batch{Group: "nope", Job: 0}, 0); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("an unknown group: %v", err)
	}
	if addr, self := s.Owner("g"); addr != "" || !self {
		t.Fatalf("owner %q %v", addr, self)
	}
}

// The same bytes staged again by their own producer are no new batch; the
// second job's PUT of the same bytes counts as its copy.
func TestSameBytesAgain(t *testing.T) {
	s, h := newService(t, 1<<20, 2, 4)
	ctx := bounded(t)
	b := Batch{Group: "g", Job: 0, Index: 0}
	if created, err := s.PutBatch(ctx, b, []byte("abcd"), time.Second); err != nil || !created {
		t.Fatal(created, err)
	}
	if created, err := s.PutBatch(ctx, b, []byte("abcd"), time.Second); err != nil || created {
		t.Fatalf("again: %v %v", created, err)
	}
	if h.held() != 4 {
		t.Fatalf("held %d", h.held())
	}
	b.Job = 1
	if created, err := s.PutBatch(ctx, b, []byte("abcd"), time.Second); err != nil || created {
		t.Fatalf("job 1's copy: %v %v", created, err)
	}
	if info, _ := s.LocalInfo("g"); info.StagedBatches != 0 || h.held() != 0 || info.Jobs[0].Prepared != 1 {
		t.Fatalf("both jobs have it: %+v, held %d", info, h.held())
	}
}

// Staged bytes come from the heap or the file.
func TestStagedBytes(t *testing.T) {
	if b, err := (Staged{Data: []byte("x")}).Bytes(); err != nil || string(b) != "x" {
		t.Fatal(b, err)
	}
	if _, err := (Staged{Path: t.TempDir() + "/none"}).Bytes(); err == nil {
		t.Fatal("a missing file read")
	}
}

// The producer rule at its edges: one job, one batch, a job detached from
// exactly this position, detachments naming no job of the group, and the
// round-robin of taken-over batches position by position.
func TestProducerEdges(t *testing.T) {
	if p := Producer(1, 10, nil, 3); p != 0 {
		t.Fatalf("one job: %d", p)
	}
	if p := Producer(3, 1, nil, 2); p != 0 {
		t.Fatalf("one batch an epoch, epoch 2: %d", p)
	}
	if Producer(0, 10, nil, 0) != -1 || Producer(2, 0, nil, 0) != -1 {
		t.Fatal("a group of no jobs or no batches has a producer")
	}
	det := []Detached{{Job: 1, From: 3}}
	if p := Producer(2, 10, det, 3); p != 0 {
		t.Fatalf("detached from exactly this position: %d", p)
	}
	if p := Producer(2, 10, det, 1); p != 1 {
		t.Fatalf("before its detachment: %d", p)
	}
	if p := Producer(2, 10, []Detached{{Job: 1}, {Job: 2}, {Job: -1}}, 1); p != 0 {
		t.Fatalf("strangers among the detached: %d", p)
	}
	for _, c := range []struct {
		jobs int
		det  []Detached
		want []int
	}{
		{4, []Detached{{Job: 1}, {Job: 3}}, []int{0, 0, 2, 2, 0, 0, 2, 2, 0, 0, 2, 2}},
		{3, []Detached{{Job: 1}}, []int{0, 0, 2, 0, 2, 2, 0, 0, 2, 0, 2, 2}},
	} {
		for b, want := range c.want {
			if p := Producer(c.jobs, 12, c.det, uint64(b)); p != want {
				t.Errorf("%d jobs, %v detached, batch %d: producer %d; want %d", c.jobs, c.det, b, p, want)
			}
		}
	}
}

// New's defaults: a 30 s timeout and DefaultLinger.
func TestNewDefaults(t *testing.T) {
	s := New(newFakeHost(0), Config{})
	defer s.Close()
	if s.cfg.Timeout != 30*time.Second || s.cfg.Linger != DefaultLinger || s.cfg.Logger == nil {
		t.Fatalf("defaults: %+v", s.cfg)
	}
	s2 := New(newFakeHost(0), Config{Timeout: time.Minute, Linger: time.Second})
	defer s2.Close()
	if s2.cfg.Timeout != time.Minute || s2.cfg.Linger != time.Second {
		t.Fatalf("given: %+v", s2.cfg)
	}
}

// A job silent for exactly the timeout is still attached; a moment longer
// and it is detached, and what only it had yet to read is freed with its
// memory.
func TestTimeoutAtItsEdge(t *testing.T) {
	s, h := newService(t, 1<<20, 2, 4)
	ctx := bounded(t)
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: 0}, []byte("abcd"), time.Second); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	st := s.stages["g"]
	last0, last1 := st.jobs[0].last, st.jobs[1].last
	s.mu.Unlock()
	s.tick(last1.Add(s.cfg.Timeout))
	if info, _ := s.LocalInfo("g"); info.Jobs[1].Detached || info.Jobs[0].Detached {
		t.Fatalf("detached at exactly the timeout: %+v", info.Jobs)
	}
	s.tick(last1.Add(s.cfg.Timeout + time.Nanosecond))
	info, _ := s.LocalInfo("g")
	if !info.Jobs[1].Detached || info.Jobs[0].Detached != !last0.After(last1) {
		t.Fatalf("after the timeout: %+v", info.Jobs)
	}
	if info.StagedBatches != 0 || h.held() != 0 {
		t.Fatalf("the batch only job 1 lacked stays: %d staged, %d bytes claimed", info.StagedBatches, h.held())
	}
	// Job 0's request is over (not in flight): its silence counts from its end.
	s.tick(last0.Add(s.cfg.Timeout + time.Nanosecond))
	if info, _ := s.LocalInfo("g"); !info.Jobs[0].Detached {
		t.Fatalf("job 0 silent past the timeout: %+v", info.Jobs[0])
	}
}

// A request's position is epoch × batches + index: a fresh stage takes any
// epoch, and its info says where each job is.
func TestPositionOfALaterEpoch(t *testing.T) {
	s, _ := newService(t, 1<<20, 2, 4)
	if _, err := s.PutBatch(bounded(t), Batch{Group: "g", Job: 1, Epoch: 3, Index: 1}, []byte("x"), time.Second); err != nil {
		t.Fatal(err)
	}
	info, _ := s.LocalInfo("g")
	if j := info.Jobs[1]; j.Epoch != 3 || j.Batch != 1 || !j.Seen || j.Prepared != 1 {
		t.Fatalf("job 1: %+v", j)
	}
}

// Refusals name the ranges a request may use; the last epoch allowed is
// maxEpoch itself.
func TestRequestRanges(t *testing.T) {
	s, _ := newService(t, 1<<20, 2, 4)
	ctx := bounded(t)
	if _, _, err := s.Get(ctx, Batch{Group: "g", Job: 0, Epoch: maxEpoch, Index: 0}, 0); !errors.Is(err, ErrNotStaged) {
		t.Fatalf("epoch maxEpoch, whose batch 0 job 0 prepares: %v", err)
	}
	if _, p, err := s.Get(ctx, Batch{Group: "g", Job: 2}, 0); err == nil || !strings.Contains(err.Error(), "has jobs 0..1 ") || p != -1 {
		t.Fatalf("job out of range: %v (producer %d)", err, p)
	}
	if _, p, err := s.Get(ctx, Batch{Group: "nope", Job: 0}, 0); !errors.Is(err, catalog.ErrNotFound) || p != -1 {
		t.Fatalf("an unknown group: %v (producer %d)", err, p)
	}
	// Job 0 is in epoch maxEpoch now: epoch 0 is out of its reach.
	if _, p, err := s.Get(ctx, Batch{Group: "g", Job: 0, Epoch: 0, Index: 1}, 0); !errors.Is(err, catalog.ErrConflict) || p != -1 {
		t.Fatalf("a read out of reach: %v (producer %d)", err, p)
	}
	if _, _, err := s.Get(ctx, Batch{Group: "g", Job: 0, Index: -1}, 0); err == nil || !strings.Contains(err.Error(), "has batches 0..9") {
		t.Fatalf("batch out of range: %v", err)
	}
}

// MaxBatchBytes 0 bounds nothing.
func TestNoBatchBound(t *testing.T) {
	h := newFakeHost(1 << 20)
	s := New(h, Config{Timeout: time.Hour})
	t.Cleanup(s.Close)
	w := 4
	if _, _, err := s.Put(bounded(t), "g", api.GroupSpec{Dataset: "ds", Seed: 1, BatchSize: 4, Jobs: 2, Window: &w}); err != nil {
		t.Fatal(err)
	}
	if created, err := s.PutBatch(bounded(t), Batch{Group: "g", Job: 0, Index: 0}, make([]byte, 4096), time.Second); err != nil || !created {
		t.Fatalf("a batch with no bound set: %v %v", created, err)
	}
}

// A job not seen yet may ask for the furthest attached job's epoch or the
// next, wherever the others are in the job order; a read may reach exactly
// W batches past what is staged, and not one more.
func TestReachOfANewJobAndItsEdge(t *testing.T) {
	s, _ := newService(t, 1<<20, 3, 20)
	ctx := bounded(t)
	put := func(job int, epoch uint64, index int) error {
		_, err := s.PutBatch(ctx, Batch{Group: "g", Job: job, Epoch: epoch, Index: index}, []byte{byte(job), byte(index)}, time.Second)
		return err
	}
	if err := put(1, 0, 5); err != nil {
		t.Fatal(err)
	}
	if err := put(0, 1, 0); err != nil { // job 0, first in the order, is ahead of job 1
		t.Fatal(err)
	}
	if err := put(2, 0, 6); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("a new job asking for an epoch behind the furthest: %v", err)
	}
	if err := put(2, 2, 0); err != nil {
		t.Fatalf("a new job asking for the epoch after the furthest: %v", err)
	}

	s2, _ := newService(t, 1<<20, 2, 4)
	if _, _, err := s2.Get(ctx, Batch{Group: "g", Job: 0, Index: 4}, 0); !errors.Is(err, ErrNotStaged) {
		t.Fatalf("a read exactly W past nothing staged: %v", err)
	}
	if _, _, err := s2.Get(ctx, Batch{Group: "g", Job: 1, Index: 5}, 0); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("a read W+1 past: %v", err)
	}
	s3, _ := newService(t, 1<<20, 2, 4)
	if _, _, err := s3.Get(ctx, Batch{Group: "g", Job: 1, Epoch: 1, Index: 5}, 0); !errors.Is(err, catalog.ErrConflict) ||
		!strings.Contains(err.Error(), "batch 5 of epoch 1 is more than 4 batches past") {
		t.Fatalf("a read W+1 past the first of epoch 1: %v", err)
	}
}

// A detached job's share is taken over from one past the furthest batch
// it staged, however its PUTs were ordered.
func TestDetachedFromItsFurthestPut(t *testing.T) {
	s, _ := newService(t, 1<<20, 2, 8)
	ctx := bounded(t)
	for _, i := range []int{0, 4, 2} {
		if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Index: i}, []byte{byte(i)}, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	s.tick(time.Now().Add(2 * time.Hour))
	info, _ := s.LocalInfo("g")
	if j := info.Jobs[0]; !j.Detached || j.From == nil || *j.From != 5 {
		t.Fatalf("job 0 detached from %v; want 5", j.From)
	}
}

// The positions remembered as served to everyone are bounded by keptDone,
// the oldest forgotten first.
func TestDoneIsBounded(t *testing.T) {
	st := newStage(&catalog.Group{Name: "g", Jobs: 1, BatchSize: 1, Samples: 1, Window: 1}, time.Now())
	for pos := range uint64(keptDone) {
		st.markDone(pos)
	}
	st.markDone(0) // again: no second entry
	if len(st.done) != keptDone || len(st.doneQ) != keptDone {
		t.Fatalf("%d remembered of exactly keptDone", len(st.done))
	}
	st.markDone(keptDone)
	if _, ok := st.done[0]; ok || len(st.done) != keptDone {
		t.Fatalf("past the bound: %d remembered, the oldest kept %v", len(st.done), ok)
	}
}

// In shared memory, the same bytes again are no conflict.
func TestSameBytesAgainInSharedMemory(t *testing.T) {
	h := newFakeHost(1 << 20)
	s := New(h, Config{Timeout: time.Hour, ShmDir: t.TempDir(), ShmTag: "t"})
	t.Cleanup(s.Close)
	w := 4
	ctx := bounded(t)
	if _, _, err := s.Put(ctx, "g", api.GroupSpec{Dataset: "ds", Seed: 1, BatchSize: 4, Jobs: 2, Window: &w}); err != nil {
		t.Fatal(err)
	}
	b := Batch{Group: "g", Job: 0, Index: 0}
	if created, err := s.PutBatch(ctx, b, []byte("bytes"), time.Second); err != nil || !created {
		t.Fatal(created, err)
	}
	if created, err := s.PutBatch(ctx, b, []byte("bytes"), time.Second); err != nil || created {
		t.Fatalf("the same bytes again: %v %v", created, err)
	}
	if _, err := s.PutBatch(ctx, b, []byte("other"), time.Second); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("other bytes: %v", err)
	}
}

// A batch's file is named by the node, its tag, the group and the
// position; a restart removes this node's leftovers and says how many.
func TestSharedMemoryNamesAndLeftovers(t *testing.T) {
	dir := t.TempDir()
	h := newFakeHost(1 << 20)
	s := New(h, Config{Timeout: time.Hour, ShmDir: dir, ShmTag: "t1"})
	w := 4
	ctx := bounded(t)
	if _, _, err := s.Put(ctx, "g", api.GroupSpec{Dataset: "ds", Seed: 1, BatchSize: 4, Jobs: 2, Window: &w}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 0, Epoch: 1, Index: 2}, []byte("x"), time.Second); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	if len(files) != 1 || !strings.HasPrefix(filepath.Base(files[0]), "stallfree-self-t1-g-12-") {
		t.Fatalf("files %v; want one named for position 12", files)
	}
	other := filepath.Join(dir, "stallfree-self-t2-g-0-x") // another node's, same name, other tag
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// The node dies without removing its files; its next run does.
	var logged bytes.Buffer
	s2 := New(h, Config{Timeout: time.Hour, ShmDir: dir, ShmTag: "t1", Logger: slog.New(slog.NewTextHandler(&logged, nil))})
	if _, err := os.Stat(files[0]); !os.IsNotExist(err) {
		t.Fatalf("a leftover stayed: %v", err)
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("another node's file went: %v", err)
	}
	if !strings.Contains(logged.String(), "files=1") {
		t.Fatalf("logged %q", logged.String())
	}
	s2.Close()
	s.Close()
	logged.Reset()
	New(h, Config{ShmDir: dir, ShmTag: "t1", Logger: slog.New(slog.NewTextHandler(&logged, nil))}).Close()
	if logged.Len() != 0 {
		t.Fatalf("a start with nothing to remove logged %q", logged.String())
	}
}

// A reader waiting for a batch whose job is detached meanwhile (another job
// ran more than W batches ahead) is told at once, with no producer.
func TestWaiterDetachedWhileWaiting(t *testing.T) {
	s, _ := newService(t, 1<<20, 2, 2)
	ctx := bounded(t)
	res := make(chan error, 1)
	go func() {
		_, p, err := s.Get(ctx, Batch{Group: "g", Job: 0, Index: 1}, 10*time.Second) // job 1 prepares it
		if p != -1 {
			err = fmt.Errorf("producer %d for a detached job (%v)", p, err)
		}
		res <- err
	}()
	testutil.Await(t, "the reader in flight", func() bool { info, _ := s.LocalInfo("g"); return info.Jobs[0].Seen })
	for _, i := range []int{3, 4} {
		if _, err := s.PutBatch(ctx, Batch{Group: "g", Job: 1, Index: i}, []byte{byte(i)}, time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-res; !errors.Is(err, ErrDetached) {
		t.Fatalf("the waiter: %v", err)
	}
}

// A new group's PUT says it was created and shows it.
func TestPutNewGroup(t *testing.T) {
	h := newFakeHost(1 << 20)
	s := New(h, Config{Timeout: time.Hour})
	t.Cleanup(s.Close)
	w := 2
	info, created, err := s.Put(bounded(t), "new", api.GroupSpec{Dataset: "ds", Seed: 3, BatchSize: 4, Jobs: 3, Window: &w})
	if err != nil || !created || info.Name != "new" || info.Seed != 3 || len(info.Jobs) != 3 || info.Owner != "self" {
		t.Fatalf("put: %+v %v %v", info, created, err)
	}
}
