package node

import (
	"bytes"
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/cespare/xxhash/v2"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/control"
	"stallfree/internal/testutil"
	"stallfree/store"
)

func putJob(t *testing.T, n *Node, j api.Job) api.Job {
	t.Helper()
	got, err := n.Control().PutJob(context.Background(), j)
	if err != nil {
		t.Fatalf("PutJob %+v: %v", j, err)
	}
	return got
}

// A job is checked before it reaches the catalog, its dataset must exist,
// and it reads back, lists and deletes as registered.
func TestJobRegistration(t *testing.T) {
	n, _, _ := startNode(t, 20, 8, 1<<20, false)
	ctx := context.Background()
	if _, err := n.Control().PutJob(ctx, api.Job{Name: "j", Dataset: "ds", WorldSize: 0, BatchSize: 4}); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("world size 0: %v", err)
	}
	if _, err := n.Control().PutJob(ctx, api.Job{Name: "j", Dataset: "nope", WorldSize: 1, BatchSize: 4}); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("unknown dataset: %v", err)
	}
	if n.Control().HasJob("j") || len(n.Control().Jobs()) != 0 {
		t.Fatal("a refused job was registered")
	}
	got := putJob(t, n, api.Job{Name: "j", Dataset: "ds", Seed: 9, WorldSize: 2, BatchSize: 4})
	if got.Name != "j" || got.Dataset != "ds" || got.Seed != 9 || got.WorldSize != 2 || got.BatchSize != 4 || got.Version == 0 || got.Previous != nil {
		t.Fatalf("registered %+v", got)
	}
	resized := putJob(t, n, api.Job{Name: "j", Dataset: "ds", Seed: 9, WorldSize: 1, BatchSize: 4})
	if resized.Previous == nil || resized.Previous.Generation != got.Version || resized.Previous.WorldSize != 2 {
		t.Fatalf("resized %+v: want generation %d kept as previous", resized, got.Version)
	}
	if j, err := n.Control().Job(ctx, "j"); err != nil || j.Version != resized.Version || !n.Control().HasJob("j") {
		t.Fatalf("Job: %+v, %v", j, err)
	}
	if js := n.Control().Jobs(); len(js) != 1 || js[0].Name != "j" {
		t.Fatalf("Jobs: %+v", js)
	}
	if err := n.Control().DeleteJob(ctx, "j"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Control().Job(ctx, "j"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("deleted job: %v", err)
	}
}

// A rank's order is its share of the epoch, the same on every call; ranks
// and epochs out of range are refused; only the epoch after the latest
// started one may start.
func TestRankOrdersAndEpochs(t *testing.T) {
	n, _, _ := startNode(t, 30, 8, 1<<20, false)
	ctx := context.Background()
	putJob(t, n, api.Job{Name: "j", Dataset: "ds", Seed: 5, WorldSize: 3, BatchSize: 4, Ranks: []string{"t1", "t1", "t1"}})
	seen := map[int]bool{}
	for r := range 3 {
		o, err := n.Control().RankOrder(ctx, "j", 0, r)
		if err != nil {
			t.Fatal(err)
		}
		if len(o.Indices) != 10 || o.BatchSize != 4 || o.Batches != 3 || o.Epoch != 0 || o.Remote != 0 {
			t.Fatalf("rank %d: %+v", r, o)
		}
		for _, i := range o.Indices {
			if seen[i] {
				t.Fatalf("item %d in two ranks", i)
			}
			seen[i] = true
		}
	}
	if len(seen) != 30 {
		t.Fatalf("%d items in the epoch, want 30", len(seen))
	}
	for _, r := range []int{-1, 3} {
		if _, err := n.Control().RankOrder(ctx, "j", 0, r); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if _, err := n.Control().RankOrder(ctx, "nope", 0, 0); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("unknown job: %v", err)
	}
	if _, err := n.Control().RankOrder(ctx, "j", control.MaxEpoch+1, 0); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("epoch past the bound: %v", err)
	}
	if _, err := n.Control().RankOrder(ctx, "j", 2, 0); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("epoch 2 while at 0: %v", err)
	}
	if _, err := n.Control().RankOrder(ctx, "j", 1, 0); err != nil {
		t.Fatalf("the next epoch: %v", err)
	}
	if _, err := n.Control().RankOrder(ctx, "j", 1, 2); err != nil {
		t.Fatalf("the current epoch again: %v", err)
	}
	// A job's first epoch may be any, so a run can resume from a checkpoint;
	// after it, an earlier epoch never started is over.
	putJob(t, n, api.Job{Name: "k", Dataset: "ds", Seed: 5, WorldSize: 1, BatchSize: 4})
	if err := n.Control().PinEpoch(ctx, "k", 7); err != nil {
		t.Fatalf("a first epoch of 7: %v", err)
	}
	if latest, ok := n.cat.LatestEpoch("k"); !ok || latest != 7 {
		t.Fatalf("latest epoch of k: %d %v", latest, ok)
	}
	if _, err := n.Control().RankOrder(ctx, "k", 6, 0); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "is over") {
		t.Fatalf("an epoch before the first: %v", err)
	}
	if _, err := n.Control().RankOrder(ctx, "k", 9, 0); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "the next to start is 8") {
		t.Fatalf("epoch 9 while at 7: %v", err)
	}
	if _, err := n.Control().RankOrder(ctx, "k", 8, 0); err != nil {
		t.Fatalf("epoch 8 after 7: %v", err)
	}
	putJob(t, n, api.Job{Name: "last", Dataset: "ds", Seed: 5, WorldSize: 1, BatchSize: 4})
	if _, err := n.Control().RankOrder(ctx, "last", control.MaxEpoch, 0); err != nil {
		t.Fatalf("the last epoch there may be: %v", err)
	}
}

// The plan the policy predicts for an epoch not started yet is the plan it
// gets once started on the same members; predicting pins nothing.
func TestPredictPlanPinsNothing(t *testing.T) {
	n, _, _ := startNode(t, 30, 8, 1<<20, false)
	putJob(t, n, api.Job{Name: "j", Dataset: "ds", Seed: 5, WorldSize: 2, BatchSize: 4, Ranks: []string{"t1", "t1"}})
	pred, members, err := n.Control().PredictPlan("j", 0)
	if err != nil || len(members) != 1 || members[0] != "t1" {
		t.Fatalf("predict: %v, members %v", err, members)
	}
	if _, ok := n.cat.LatestEpoch("j"); ok {
		t.Fatal("predicting pinned an epoch")
	}
	ep, err := n.Control().Plan(context.Background(), "j", 0)
	if err != nil {
		t.Fatal(err)
	}
	pinned, _, err := n.Control().PredictPlan("j", 0)
	if err != nil {
		t.Fatal(err)
	}
	for r := range ep.Ranks {
		if !slices.Equal(pred.Ranks[r], ep.Ranks[r]) || !slices.Equal(pinned.Ranks[r], ep.Ranks[r]) {
			t.Fatalf("rank %d: predicted and pinned plans differ", r)
		}
	}
	if _, _, err := n.Control().PredictPlan("nope", 0); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("unknown job: %v", err)
	}
}

// Batches of a job's rank are its order cut in batch_size pieces, with the
// files' bytes, counted per job, rank and where they came from.
func TestJobBatchesFollowTheOrder(t *testing.T) {
	n, d, files := startNode(t, 22, 16, 1<<20, false)
	ctx := context.Background()
	putJob(t, n, api.Job{Name: "j", Dataset: "ds", Seed: 1, WorldSize: 2, BatchSize: 4, Ranks: []string{"t1", "t1"}})
	o, err := n.Control().RankOrder(ctx, "j", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	var got []int
	for b := range o.Batches {
		items, spans, err := n.JobBatch(ctx, "j", 0, 1, b)
		if err != nil || spans != nil {
			t.Fatalf("batch %d: %v, spans %v", b, err, spans)
		}
		for _, it := range items {
			i, _ := d.Manifest.Index(it.Key)
			if !bytes.Equal(it.Data, files[it.Key]) {
				t.Fatalf("batch %d: item %s differs from its file", b, it.Key)
			}
			got = append(got, i)
			it.Release()
		}
	}
	if !slices.Equal(got, o.Indices) {
		t.Fatalf("batches gave %v, the order is %v", got, o.Indices)
	}
	for _, c := range []struct{ rank, batch int }{{2, 0}, {-1, 0}, {0, o.Batches}, {0, -1}} {
		if _, _, err := n.JobBatch(ctx, "j", 0, c.rank, c.batch); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("rank %d batch %d: %v", c.rank, c.batch, err)
		}
	}
	if _, _, err := n.JobBatch(ctx, "nope", 0, 0, 0); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("unknown job: %v", err)
	}
	if m := counterValue(t, n.jobMetrics.items.WithLabelValues("j", "1", "miss")); m != float64(len(got)) {
		t.Fatalf("miss count for rank 1: %v, want %d", m, len(got))
	}
	if m := counterValue(t, n.jobMetrics.bytes.WithLabelValues("j", "1", "miss")); m != float64(16*len(got)) {
		t.Fatalf("miss bytes for rank 1: %v", m)
	}
	// Read again, every item is local now.
	items, _, err := n.JobBatch(ctx, "j", 0, 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, it := range items {
		it.Release()
	}
	if m := counterValue(t, n.jobMetrics.items.WithLabelValues("j", "1", "local")); m != float64(len(items)) {
		t.Fatalf("local count: %v, want %d", m, len(items))
	}
	if m := counterValue(t, n.jobMetrics.items.WithLabelValues("j", "0", "miss")); m != 0 {
		t.Fatalf("rank 0 counted %v items it never read", m)
	}
	recorded := []Item{{Cache: Peer, Data: make([]byte, 3)}}
	n.jobMetrics.record("j", 0, recorded)
	if m := counterValue(t, n.jobMetrics.bytes.WithLabelValues("j", "0", "peer")); m != 3 {
		t.Fatalf("peer bytes: %v", m)
	}
}

// Resuming under the current generation is the rank's order from the
// position on; a position past the rank's share or an unknown generation is
// refused.
func TestResumedOrderUnderTheSameGeneration(t *testing.T) {
	n, _, _ := startNode(t, 40, 8, 1<<20, false)
	ctx := context.Background()
	j := putJob(t, n, api.Job{Name: "j", Dataset: "ds", Seed: 2, WorldSize: 2, BatchSize: 4, Ranks: []string{"t1", "t1"}})
	full, err := n.Control().RankOrder(ctx, "j", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, pos := range []int{0, 7, 20} {
		o, err := n.Control().ResumedOrder(ctx, "j", 0, 1, j.Version, pos)
		if err != nil || !slices.Equal(o.Indices, full.Indices[pos:]) || o.Batches != (20-pos+3)/4 {
			t.Fatalf("from %d: %+v, %v", pos, o, err)
		}
	}
	for _, pos := range []int{-1, 21} {
		if _, err := n.Control().ResumedOrder(ctx, "j", 0, 1, j.Version, pos); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("position %d: %v", pos, err)
		}
	}
	if _, err := n.Control().ResumedOrder(ctx, "j", 0, 2, j.Version, 0); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("rank 2: %v", err)
	}
	if _, err := n.Control().ResumedOrder(ctx, "j", 0, 0, j.Version+100, 0); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("unknown generation: %v", err)
	}
	// Epoch 0 started under the previous generation: the single rank gets
	// everything both old ranks had left, and asking again gives the same plan.
	putJob(t, n, api.Job{Name: "j", Dataset: "ds", Seed: 2, WorldSize: 1, BatchSize: 4, Ranks: []string{"t1"}})
	a, err := n.Control().ResumedOrder(ctx, "j", 0, 0, j.Version, 4)
	if err != nil || len(a.Indices) != 32 {
		t.Fatalf("re-split: %d samples, %v; want 2 x 16", len(a.Indices), err)
	}
	b, err := n.Control().ResumedOrder(ctx, "j", 0, 0, j.Version, 4)
	if err != nil || !slices.Equal(a.Indices, b.Indices) {
		t.Fatalf("asked again: %v", err)
	}
	// The re-split plans kept are bounded: control.MaxPlans, then they start over.
	for pos := range control.MaxPlans {
		if _, err := n.Control().ResumedOrder(ctx, "j", 0, 0, j.Version, pos); err != nil {
			t.Fatal(err)
		}
	}
	if n.ctl.ResumedPlans() != control.MaxPlans {
		t.Fatalf("%d re-split plans kept after %d resumes, want %d", n.ctl.ResumedPlans(), control.MaxPlans, control.MaxPlans)
	}
	if _, err := n.Control().ResumedOrder(ctx, "j", 0, 0, j.Version, control.MaxPlans); err != nil {
		t.Fatal(err)
	}
	if n.ctl.ResumedPlans() != 1 {
		t.Fatalf("%d re-split plans kept past the bound, want 1", n.ctl.ResumedPlans())
	}
	// Epoch 1 never started under it and cannot be resumed.
	if _, err := n.Control().ResumedOrder(ctx, "j", 1, 0, j.Version, 4); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("epoch 1 never started under generation %d: %v", j.Version, err)
	}
}

// Reported positions are kept per rank, listed by rank, bounded, and only
// for registered jobs and ranks in range.
func TestRankPositions(t *testing.T) {
	n, _, _ := startNode(t, 10, 8, 1<<20, false)
	putJob(t, n, api.Job{Name: "j", Dataset: "ds", Seed: 1, WorldSize: 1, BatchSize: 2})
	if err := n.Control().ReportPosition("nope", api.RankPosition{}); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("unknown job: %v", err)
	}
	for _, bad := range []api.RankPosition{{Rank: api.MaxWorldSize}, {Epoch: control.MaxEpoch + 1}} {
		if err := n.Control().ReportPosition("j", bad); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("%+v: %v", bad, err)
		}
	}
	if err := n.Control().ReportPosition("j", api.RankPosition{Rank: api.MaxWorldSize - 1, Epoch: control.MaxEpoch}); err != nil {
		t.Fatalf("the largest rank and epoch: %v", err)
	}
	for _, r := range []int{3, 1, 2} {
		if err := n.Control().ReportPosition("j", api.RankPosition{Rank: r, Epoch: 4, Position: 10 * r, Generation: 1}); err != nil {
			t.Fatal(err)
		}
	}
	ps := n.Control().RankPositions("j")
	if len(ps) != 4 || ps[0].Rank != 1 || ps[1].Rank != 2 || ps[2].Rank != 3 || ps[1].Position != 20 || ps[1].Epoch != 4 {
		t.Fatalf("positions %+v", ps)
	}
	if ps[0].SecondsAgo < 0 || ps[0].SecondsAgo > 60 {
		t.Fatalf("seconds ago %v", ps[0].SecondsAgo)
	}
	if len(n.Control().RankPositions("other")) != 0 {
		t.Fatal("positions for a job nobody reported")
	}
	// The table holds 4×world_size+64 ranks and one more, then starts over.
	putJob(t, n, api.Job{Name: "w2", Dataset: "ds", Seed: 1, WorldSize: 2, BatchSize: 2})
	const bound = 4*2 + 64
	for r := range bound + 1 {
		if err := n.Control().ReportPosition("w2", api.RankPosition{Rank: r}); err != nil {
			t.Fatal(err)
		}
	}
	if got := len(n.Control().RankPositions("w2")); got != bound+1 {
		t.Fatalf("%d positions after %d reports, want all kept", got, bound+1)
	}
	if err := n.Control().ReportPosition("w2", api.RankPosition{Rank: bound + 1}); err != nil {
		t.Fatal(err)
	}
	if ps := n.Control().RankPositions("w2"); len(ps) != 1 || ps[0].Rank != bound+1 {
		t.Fatalf("%d positions past the bound, want the table started over with the last", len(ps))
	}
}

// The stats and the Prometheus metrics read the same counters.
func TestStatsAndMetricsAgree(t *testing.T) {
	n, d, _ := startNode(t, 10, 100, 1<<20, false)
	ctx := context.Background()
	for range 2 {
		for i := range 10 {
			it, err := n.Get(ctx, d, i)
			if err != nil {
				t.Fatal(err)
			}
			it.Release()
		}
	}
	n.ServedBytes(1234)
	n.Split().ReportLoader(api.LoaderWait{Seconds: 1.5, Batches: 7})
	n.counters.relayedReads.Add(1) // what a read the leader answered counts (control.ReadFromLeader)
	st := n.Stats()
	if st.HitsLocal != 10 || st.Misses != 10 || st.SourceReads != 10 || st.SourceBytes != 1000 || st.BytesServed != 1234 ||
		st.LoaderWaitSeconds != 1.5 || st.LoaderBatches != 7 || st.ItemsCached != 10 || st.BytesCached != 1000 || st.CapacityBytes != 1<<20 || st.Name != "t1" || st.Policy != "lru" {
		t.Fatalf("stats %+v", st)
	}
	want := map[string]float64{
		"stallfree_hits_local_total": 10, "stallfree_misses_total": 10, "stallfree_source_reads_total": 10,
		"stallfree_source_bytes_total": 1000, "stallfree_served_bytes_total": 1234, "stallfree_loader_wait_seconds_total": 1.5,
		"stallfree_loader_batches_total": 7, "stallfree_relayed_reads_total": 1, "stallfree_items_cached": 10,
		"stallfree_bytes_cached": 1000, "stallfree_capacity_bytes": 1 << 20, "stallfree_hits_peer_total": 0,
		"stallfree_used_bytes": float64(st.UsedBytes),
	}
	fams, err := n.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		w, ok := want[f.GetName()]
		if !ok {
			continue
		}
		m := f.GetMetric()[0]
		v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
		if math.Abs(v-w) > 1e-9 {
			t.Fatalf("%s = %v, want %v", f.GetName(), v, w)
		}
		delete(want, f.GetName())
	}
	if len(want) != 0 {
		t.Fatalf("metrics missing: %v", want)
	}
	if n.Name() != "t1" || n.Control().AppliedIndex() == 0 || !n.Control().IsLeader() || n.Control().LeaderHTTP() != n.cfg.HTTPAdvert {
		t.Fatalf("name %q, applied %d, leader %v %q", n.Name(), n.Control().AppliedIndex(), n.Control().IsLeader(), n.Control().LeaderHTTP())
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// Under the clairvoyant policy a node reads a job's epoch ahead of its
// loader: once the epoch starts, its first batch is in memory before it is
// asked for, and served as hits.
func TestClairvoyantReadsTheJobAhead(t *testing.T) {
	n, d, files := startNodeWith(t, 64, 128, 1<<20, false, "clairvoyant")
	ctx := context.Background()
	putJob(t, n, api.Job{Name: "j", Dataset: "ds", Seed: 8, WorldSize: 1, BatchSize: 8})
	o, err := n.Control().RankOrder(ctx, "j", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	first := o.Indices[:8]
	testutil.Await(t, "the first batch to be read ahead", func() bool {
		return !slices.ContainsFunc(first, func(i int) bool { return !n.Split().Holds(d, i) })
	})
	items, _, err := n.JobBatch(ctx, "j", 0, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	for x, it := range items {
		if it.Cache != Hit || !bytes.Equal(it.Data, files[d.Manifest.Key(first[x])]) {
			t.Fatalf("position %d: %s", x, it.Cache)
		}
		it.Release()
	}
	if n.Stats().Misses != 0 {
		t.Fatalf("%d misses serving a batch read ahead", n.Stats().Misses)
	}
}

// A read for the loader that must not be cached comes from storage, is
// counted as a storage read and leaves nothing in memory.
func TestReadUncached(t *testing.T) {
	n, d, files := startNode(t, 4, 64, 1<<20, false)
	it, err := n.ReadUncached(context.Background(), d, 2)
	if err != nil || !bytes.Equal(it.Data, files[d.Manifest.Key(2)]) || it.Sum != xxhash.Sum64(it.Data) || it.Key != d.Manifest.Key(2) {
		t.Fatalf("ReadUncached: %v", err)
	}
	it.Release()
	if st := n.Stats(); n.Split().Holds(d, 2) || st.SourceReads != 1 || st.Misses != 0 {
		t.Fatalf("held %v, stats %+v", n.Split().Holds(d, 2), st)
	}
	if it, err := n.ReadUncached(context.Background(), d, 0); err != nil || !bytes.Equal(it.Data, files[d.Manifest.Key(0)]) {
		t.Fatalf("the first item: %v", err)
	} else {
		it.Release()
	}
	for _, i := range []int{-1, 4} {
		if _, err := n.ReadUncached(context.Background(), d, i); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("index %d: %v", i, err)
		}
	}
}

// A single item read into a fresh buffer (a miss, a peer's copy, a read
// that bypasses the cache) is charged to --max-inflight-bytes until it is
// released, as a batch's items are; a hit, which pins store memory, is not.
// Past the bound: ErrBusy (503). An item larger than the whole bound is read
// alone. The attack round held 2 GB with 16 slow readers of a 120 MiB item.
func TestSingleItemReadsAreCharged(t *testing.T) {
	n, d, _ := startNodeWith(t, 6, 64, 1<<20, false, "lru", func(c *Config) { c.MaxInflightBytes = 150 })
	ctx := context.Background()
	first, err := n.Get(ctx, d, 0) // a miss: 64 bytes charged
	if err != nil {
		t.Fatal(err)
	}
	second, err := n.ReadUncached(ctx, d, 1) // 128
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Get(ctx, d, 2); !errors.Is(err, ErrBusy) {
		t.Fatalf("a third miss past the bound: %v; want ErrBusy", err)
	}
	if _, err := n.ReadUncached(ctx, d, 3); !errors.Is(err, ErrBusy) {
		t.Fatalf("a bypassing read past the bound: %v; want ErrBusy", err)
	}
	hit, err := n.Get(ctx, d, 0) // held since the miss: no charge
	if err != nil || hit.Cache != Hit {
		t.Fatalf("a hit with the bound taken: %v %v", hit.Cache, err)
	}
	hit.Release()
	first.Release()
	third, err := n.Get(ctx, d, 2)
	if err != nil {
		t.Fatalf("a miss once a charge came back: %v", err)
	}
	third.Release()
	second.Release()
	if used := chargedNow(n); used != 0 {
		t.Fatalf("%d bytes still charged after every release", used)
	}
}

// A derived dataset's manifest is its parent's, so its items were charged
// their parent items' sizes: 1 KiB results over 64-byte parents were charged
// 64 bytes each. A batch's charge is raised to the bytes it holds.
func TestDerivedBatchesAreChargedTheirOwnSize(t *testing.T) {
	n, _, _ := startNodeWith(t, 4, 64, 1<<20, false, "lru", func(c *Config) { c.MaxInflightBytes = 1500 })
	ctx := context.Background()
	if _, _, err := n.Control().Leader().DeriveDataset(ctx, "dec", "ds", "decode"); err != nil {
		t.Fatal(err)
	}
	dec, err := n.Control().Dataset(ctx, "dec")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		b := bytes.Repeat([]byte{byte('a' + i)}, 1<<10)
		if err := n.store.Put(store.MakeKey(dec.ID, uint32(i)), b, xxhash.Sum64(b)); err != nil {
			t.Fatal(err)
		}
	}
	held, err := n.GetManyFor(ctx, dec, []int{0}, "")
	if err != nil || len(held[0].Data) != 1<<10 {
		t.Fatalf("a derived item: %v", err)
	}
	if _, err := n.GetManyFor(ctx, dec, []int{1}, ""); !errors.Is(err, ErrBusy) {
		t.Fatalf("a second 1 KiB derived item beside the first, under a 1500-byte bound: %v; want ErrBusy", err)
	}
	held[0].Release()
	again, err := n.GetManyFor(ctx, dec, []int{0, 1}, "") // 2 KiB over the bound: read alone
	if err != nil {
		t.Fatalf("both alone: %v", err)
	}
	for i := range again {
		again[i].Release()
	}
	if used := chargedNow(n); used != 0 {
		t.Fatalf("%d bytes still charged after every release", used)
	}
}

// An item larger than the whole in-flight bound is still served, alone.
func TestAnItemOverTheBoundIsReadAlone(t *testing.T) {
	n, d, _ := startNodeWith(t, 2, 256, 1<<20, false, "lru", func(c *Config) { c.MaxInflightBytes = 100 })
	ctx := context.Background()
	it, err := n.Get(ctx, d, 0)
	if err != nil || len(it.Data) != 256 {
		t.Fatalf("an item over the bound: %d bytes, %v", len(it.Data), err)
	}
	if _, err := n.ReadUncached(ctx, d, 1); !errors.Is(err, ErrBusy) {
		t.Fatalf("a second one beside it: %v; want ErrBusy", err)
	}
	it.Release()
	if it, err := n.ReadUncached(ctx, d, 1); err != nil {
		t.Fatalf("alone: %v", err)
	} else {
		it.Release()
	}
}

// An order's remote count is the number of its items another member owns,
// for a whole epoch and for the rest of one resumed part-way.
func TestOrdersCountTheirRemoteItems(t *testing.T) {
	n, d, _, p := withTwoMembers(t, 80, 8)
	ctx := context.Background()
	j := putJob(t, n, api.Job{Name: "j", Dataset: "ds", Seed: 3, WorldSize: 2, BatchSize: 4, Ranks: []string{"t1", "t2"}})
	remote := func(indices []int) int {
		r := 0
		for _, i := range indices {
			if _, self := p.Owner(d, i); !self {
				r++
			}
		}
		return r
	}
	full, err := n.Control().RankOrder(ctx, "j", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if full.Remote != remote(full.Indices) {
		t.Fatalf("rank 0 (on t1): remote %d, its order has %d items t2 owns", full.Remote, remote(full.Indices))
	}
	differs := false
	for _, pos := range []int{1, 13, 39} {
		o, err := n.Control().ResumedOrder(ctx, "j", 0, 0, j.Version, pos)
		if err != nil {
			t.Fatal(err)
		}
		want := remote(full.Indices[pos:])
		if o.Remote != want {
			t.Fatalf("from %d: remote %d, want %d", pos, o.Remote, want)
		}
		differs = differs || want != full.Remote
	}
	if !differs {
		t.Fatal("every resumed order had the whole order's remote count: the test shows nothing")
	}
}

// The read-ahead's fill of an item that is already resident (another
// flight filled it first) succeeds and reads nothing.
func TestFillOfAResidentItem(t *testing.T) {
	n, d, _ := startNode(t, 3, 64, 1<<20, false)
	host := clairvoyantHost{n}
	if err := host.Fill(context.Background(), d, 1); err != nil || !n.Split().Holds(d, 1) {
		t.Fatalf("first fill: %v", err)
	}
	if err := host.Fill(context.Background(), d, 1); err != nil {
		t.Fatalf("fill of a resident item: %v", err)
	}
	if st := n.Stats(); st.SourceReads != 1 {
		t.Fatalf("%d storage reads for one item filled twice", st.SourceReads)
	}
	if !host.Owns(d, 2) {
		t.Fatal("a lone node does not own its items")
	}
}

// chargedNow is what the node's in-flight bound holds charged.
func chargedNow(n *Node) uint64 {
	n.inflight.mu.Lock()
	defer n.inflight.mu.Unlock()
	return n.inflight.used
}
