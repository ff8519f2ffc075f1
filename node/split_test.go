package node

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/internal/testutil"
	"stallfree/planner"
	"stallfree/store"
)

// The node's part of the memory split: a quota becomes this node's limit
// by its share of the ring, stall meters' reports become a plan, and a plan
// applied becomes quotas. The model is the planner's (tested there); what
// is tested here is what the node feeds it and does with it.

// addDataset registers name, a directory of count random files of size
// bytes, on n.
func addDataset(t *testing.T, n *Node, name string, count, size int) *catalog.Dataset {
	t.Helper()
	dir, _ := testutil.RandomFiles(t, count, size)
	ctx := context.Background()
	if _, _, err := n.Control().PutDataset(ctx, name, dir); err != nil {
		t.Fatal(err)
	}
	d, err := n.Control().Dataset(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// ownShare is the fraction of d's bytes p's ring gives t1.
func ownShare(d *catalog.Dataset, p *twoMembers) float64 {
	var own, total float64
	for i := range d.Manifest.Len() {
		size := float64(d.Manifest.Size(i))
		total += size
		if _, self := p.Owner(d, i); self {
			own += size
		}
	}
	return own / total
}

func limitOf(t *testing.T, n *Node, d *catalog.Dataset) uint64 {
	t.Helper()
	lim, ok := n.store.Limit(d.ID)
	if !ok {
		t.Fatalf("no limit for %s", d.Name)
	}
	return lim
}

// A quota is the cluster's: this node's limit is the quota times the share
// of the dataset's bytes it owns, set before the answer; a lift clears it.
// A quota below zero or over the cluster's memory changes nothing.
func TestQuotaBecomesThisNodesShare(t *testing.T) {
	n, d, _, p := withTwoMembers(t, 40, 256)
	ctx := context.Background()
	m := n.Split()
	share := ownShare(d, p)
	if share <= 0 || share >= 1 {
		t.Fatalf("t1's share %v: pick another item count", share)
	}
	if _, _, err := m.PutQuota(ctx, "ds", "", api.QuotaOf(-1)); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a negative quota: %v", err)
	}
	mem := m.ClusterMemory()
	if _, _, err := m.PutQuota(ctx, "ds", "", api.QuotaOf(int64(mem)+1)); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a quota over the cluster's memory: %v", err)
	}
	if _, ok := n.store.Limit(d.ID); ok {
		t.Fatal("a refused quota set a limit")
	}
	if _, _, err := m.PutQuota(ctx, "ds", "", api.QuotaOf(int64(mem))); err != nil {
		t.Fatalf("a quota of the whole memory: %v", err)
	}
	if got, want := limitOf(t, n, d), uint64(float64(mem)*share); got != want {
		t.Fatalf("limit %d for the whole memory, want %d", got, want)
	}
	info, created, err := m.PutQuota(ctx, "ds", "", api.QuotaOf(4000))
	if err != nil || created || info.Quota == nil || *info.Quota != 4000 {
		t.Fatalf("quota: %+v, %v, %v", info, created, err)
	}
	if got, want := limitOf(t, n, d), uint64(4000*share); got != want {
		t.Fatalf("limit %d for a quota of 4000 at share %v, want %d", got, share, want)
	}
	// Another ring: the limit follows the new share.
	p.setRing(t, "t1", "t2", "t3")
	n.Split().applyQuotas()
	if got, want := limitOf(t, n, d), uint64(4000*ownShare(d, p)); got != want {
		t.Fatalf("limit %d on a ring of three, want %d", got, want)
	}
	// Off the ring (joining): what was set stays; a plan counts its share as 1.
	before := limitOf(t, n, d)
	p.setRing(t, "t2", "t3")
	if _, _, err := m.PutQuota(ctx, "ds", "", api.QuotaOf(100)); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(t, n, d); got != before {
		t.Fatalf("off the ring the limit moved from %d to %d", before, got)
	}
	if s := m.shareOf(d); s != 1 {
		t.Fatalf("share off the ring %v, want 1", s)
	}
	p.setRing(t, "t1", "t2", "t3")
	if _, _, err := m.PutQuota(ctx, "ds", "", api.Quota{Given: true, Lift: true, Bytes: -5}); err != nil {
		t.Fatalf("lift: %v", err)
	}
	if _, ok := n.store.Limit(d.ID); ok {
		t.Fatal("a lifted quota left its limit")
	}
}

// A lone node owns all of a dataset; a deleted dataset's limit goes with it.
func TestQuotaOfALoneNode(t *testing.T) {
	n, d, _ := startNode(t, 10, 100, 64<<20, false)
	ctx := context.Background()
	if _, _, err := n.Split().PutQuota(ctx, "ds", "", api.QuotaOf(500)); err != nil {
		t.Fatal(err)
	}
	if got := limitOf(t, n, d); got != 500 {
		t.Fatalf("a lone node's limit %d, want the whole quota 500", got)
	}
	if err := n.Control().DeleteDataset(ctx, "ds"); err != nil {
		t.Fatal(err)
	}
	n.Split().applyQuotas()
	if _, ok := n.store.Limit(d.ID); ok {
		t.Fatal("a deleted dataset kept its limit")
	}
}

// With more than 255 members the owner table is two bytes an item, with
// 255 one; the share is read from it either way.
func TestQuotaShareOnAWideRing(t *testing.T) {
	testutil.Long(t) // rings of hundreds of members take seconds to build
	n, d, _, p := withTwoMembers(t, 600, 10)
	for q, members := range []int{255, 256} {
		names := []string{"t1"}
		for i := range members - 1 {
			names = append(names, fmt.Sprintf("m%03d", i))
		}
		p.setRing(t, names...)
		share := ownShare(d, p)
		if share <= 0 {
			t.Fatalf("t1 owns nothing of 600 items on %d members: pick another count", members)
		}
		quota := int64(6000 + q) // another limit each time, so each is set afresh
		if _, _, err := n.Split().PutQuota(context.Background(), "ds", "", api.QuotaOf(quota)); err != nil {
			t.Fatal(err)
		}
		if got, want := limitOf(t, n, d), uint64(float64(quota)*share); got != want {
			t.Fatalf("%d members: limit %d, want %d (share %v)", members, got, want, share)
		}
	}
}

// A node that owns none of a dataset counts its share as 1 where a plan
// divides by it; a dataset of empty items is owned whole; a quota of 0 is
// a quota.
func TestSharesAtTheirEdges(t *testing.T) {
	// onAnothers puts n on a ring of two on which d's one item is the
	// other member's.
	onAnothers := func(n *Node, d *catalog.Dataset) {
		t.Helper()
		p := newTwoMembers(t)
		for x := 0; ; x++ {
			p.setRing(t, "t1", fmt.Sprintf("other%d", x))
			if _, self := p.Owner(d, 0); !self {
				break
			}
		}
		n.peers = p
	}
	n, d, _ := startNode(t, 1, 10, 64<<20, false)
	onAnothers(n, d)
	m := n.Split()
	n.split.mu.Lock()
	share, ok := m.localShare(d)
	n.split.mu.Unlock()
	if !ok || share != 0 {
		t.Fatalf("share of a dataset owned elsewhere: %v (%v), want 0", share, ok)
	}
	if s := m.shareOf(d); s != 1 {
		t.Fatalf("share a plan divides by, of a dataset this node owns none of: %v, want 1", s)
	}
	if _, _, err := m.PutQuota(context.Background(), "ds", "", api.QuotaOf(0)); err != nil {
		t.Fatalf("a quota of 0: %v", err)
	}
	if got := limitOf(t, n, d); got != 0 {
		t.Fatalf("limit %d for a quota of 0", got)
	}

	// A dataset of an empty item: the node owns all of nothing.
	e, ed, _ := startNode(t, 1, 0, 64<<20, false)
	onAnothers(e, ed)
	e.split.mu.Lock()
	share, ok = e.Split().localShare(ed)
	e.split.mu.Unlock()
	if !ok || share != 1 {
		t.Fatalf("share of a dataset of empty items: %v (%v), want 1", share, ok)
	}
}

// Epochs done count the jobs that completed one: a job that has only begun
// does not hold the count at 0.
func TestEpochsDoneCountCompleteJobs(t *testing.T) {
	n, _, _ := startNode(t, 4, 10, 64<<20, false)
	putJob(t, n, api.Job{Name: "j", Dataset: "ds", Seed: 1, WorldSize: 1, BatchSize: 2})
	putJob(t, n, api.Job{Name: "k", Dataset: "ds", Seed: 1, WorldSize: 1, BatchSize: 2})
	m := n.Split()
	m.ReportLoader(api.LoaderWait{Job: "j", Batches: 2, Items: 4, Seconds: 1, EpochEnd: true})
	m.ReportLoader(api.LoaderWait{Job: "j", Batches: 2, Items: 4, Seconds: 1, EpochEnd: true})
	m.ReportLoader(api.LoaderWait{Job: "k", Batches: 1, Items: 2, Seconds: 1})
	if got := m.EpochsDone(); got != 2 {
		t.Fatalf("epochs done %d, want 2 (k has completed none)", got)
	}
}

// The cluster's memory is what the members alive or suspected offer: the
// dead and the departed offer none.
func TestClusterMemoryCountsTheLiving(t *testing.T) {
	n, _, _, p := withTwoMembers(t, 40, 256)
	p.others = []api.Member{{Name: "a", State: "alive", Capacity: 1}, {Name: "s", State: "suspect", Capacity: 2},
		{Name: "d", State: "dead", Capacity: 4}, {Name: "l", State: "left", Capacity: 8}}
	if got, want := n.Split().ClusterMemory(), n.cfg.Memory+3; got != want {
		t.Fatalf("cluster memory %d, want %d", got, want)
	}
}

// Stall meters' reports: the wait and batch counters add up whatever the
// report names; a report names its dataset or its job's; an epoch counts
// once every rank of every job has closed one; the plan holds the jobs with
// a complete epoch, their datasets' figures, and the memory to split; a
// plan applied sets its quotas.
func TestReportsMakeAPlan(t *testing.T) {
	n, d, _ := startNode(t, 40, 256, 64<<20, false)
	ctx := context.Background()
	m := n.Split()
	other := addDataset(t, n, "other", 20, 100)
	putJob(t, n, api.Job{Name: "j", Dataset: "ds", Seed: 1, WorldSize: 1, BatchSize: 4})
	if m.EpochsDone() != 0 {
		t.Fatal("epochs done before any report")
	}
	if p, err := m.SplitPlan(ctx); err != nil || len(p.Jobs) != 0 || len(p.Split) != 0 {
		t.Fatalf("a plan without reports: %+v, %v", p, err)
	}

	// The job's rank opens its window by job name alone, reads the whole
	// dataset from storage, and closes its epoch.
	m.ReportLoader(api.LoaderWait{Job: "j"})
	for i := range d.Manifest.Len() {
		it, err := n.Get(ctx, d, i)
		if err != nil {
			t.Fatal(err)
		}
		it.Release()
	}
	for i := range other.Manifest.Len() { // a dataset no reporting job reads, held here
		it, err := n.Get(ctx, other, i)
		if err != nil {
			t.Fatal(err)
		}
		it.Release()
	}
	m.ReportLoader(api.LoaderWait{Job: "j", Seconds: 2, StepSeconds: 1, Batches: 10, Items: 40, EpochEnd: true})
	// A report for an unknown dataset still counts its wait.
	m.ReportLoader(api.LoaderWait{Dataset: "nope", Seconds: 0.5, Batches: 3})
	st := n.Stats()
	if st.LoaderWaitSeconds != 2.5 || st.LoaderBatches != 13 {
		t.Fatalf("loader wait %v s over %d batches, want 2.5 over 13", st.LoaderWaitSeconds, st.LoaderBatches)
	}
	if m.EpochsDone() != 1 {
		t.Fatalf("epochs done %d, want 1", m.EpochsDone())
	}

	p, err := m.SplitPlan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Jobs) != 1 || p.Jobs[0].Job != "j" || p.Jobs[0].Dataset != "ds" || p.Jobs[0].EpochS != 3 || p.Jobs[0].StepS != 1 ||
		p.Jobs[0].WaitS != 2 || p.Jobs[0].MissBytes != 40*256 || p.Jobs[0].Epochs != 1 || p.Jobs[0].Ranks != 1 {
		t.Fatalf("plan jobs %+v", p.Jobs)
	}
	if len(p.Datasets) != 1 || p.Datasets[0].Dataset != "ds" || p.Datasets[0].Bytes != 40*256 || p.Datasets[0].CachedBytes != 40*256 ||
		p.Datasets[0].HitRatio != 1 || p.Datasets[0].Quota != nil || p.Datasets[0].StorageBytesPerS <= 0 {
		t.Fatalf("plan datasets %+v", p.Datasets)
	}
	held := float64(n.store.DatasetBytes(other.ID))
	if held != 20*100 {
		t.Fatalf("the other dataset holds %v bytes here", held)
	}
	want := (float64(n.cfg.Memory) - held) * 256 / (256 + store.EntryOverhead + 64)
	if p.MemoryBytes != uint64(want) {
		t.Fatalf("memory to split %d, want %d (the cluster's, less what the other dataset holds, less bookkeeping)", p.MemoryBytes, uint64(want))
	}
	if _, ok := p.Split["ds"]; !ok || len(p.Split) != 1 {
		t.Fatalf("split %v", p.Split)
	}
	if err := m.ApplySplit(ctx, p); err != nil {
		t.Fatal(err)
	}
	got, err := n.Control().Dataset(ctx, "ds")
	if err != nil || got.Quota == nil || *got.Quota != p.Split["ds"] || limitOf(t, n, d) != p.Split["ds"] {
		t.Fatalf("after apply: quota %v, limit %d; want %d", got.Quota, limitOf(t, n, d), p.Split["ds"])
	}
	if err := m.ApplySplit(ctx, api.Plan{Split: map[string]uint64{"nope": 1}}); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("a plan naming an unknown dataset: %v", err)
	}
	// The quota now stands for the dataset's current memory in a plan.
	p2, err := m.SplitPlan(ctx)
	if err != nil || len(p2.Datasets) != 1 || p2.Datasets[0].Quota == nil || *p2.Datasets[0].Quota != p.Split["ds"] {
		t.Fatalf("the next plan: %+v, %v", p2.Datasets, err)
	}
	if math.IsNaN(p2.PredictedSaving) {
		t.Fatal("a NaN saving")
	}
}

// A report that names its dataset keeps it, whatever its job reads; one
// that names only its job counts under the job's dataset.
func TestReportsNameTheirDataset(t *testing.T) {
	n, _, _ := startNode(t, 8, 64, 64<<20, false)
	ctx := context.Background()
	m := n.Split()
	dir2, _ := testutil.RandomFiles(t, 4, 32)
	if _, _, err := n.Control().PutDataset(ctx, "other", dir2); err != nil {
		t.Fatal(err)
	}
	putJob(t, n, api.Job{Name: "j", Dataset: "ds", Seed: 1, WorldSize: 1, BatchSize: 4})
	putJob(t, n, api.Job{Name: "k", Dataset: "ds", Seed: 1, WorldSize: 1, BatchSize: 4})
	m.ReportLoader(api.LoaderWait{Job: "j", Dataset: "other", Batches: 1, Items: 4, Seconds: 1, EpochEnd: true})
	m.ReportLoader(api.LoaderWait{Job: "k", Batches: 1, Items: 4, Seconds: 1, EpochEnd: true})
	p, err := m.SplitPlan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, j := range p.Jobs {
		got[j.Job] = j.Dataset
	}
	if got["j"] != "other" || got["k"] != "ds" {
		t.Fatalf("jobs' datasets in the plan: %v", got)
	}
}

// On a node that owns a share of each dataset, the plan scales what it
// measures here to the cluster: its misses, what it holds of the job's
// dataset and of a dataset no job reads, each divided by that dataset's
// share; the hit ratio is what is held of the whole.
func TestPlanScalesByShare(t *testing.T) {
	n, d, _, p := withTwoMembers(t, 40, 256)
	ctx := context.Background()
	m := n.Split()
	other := addDataset(t, n, "other", 30, 100)
	putJob(t, n, api.Job{Name: "j", Dataset: "ds", Seed: 1, WorldSize: 1, BatchSize: 4})
	mine, _ := p.split(d)
	share, otherShare := ownShare(d, p), ownShare(other, p)
	if share <= 0 || share >= 1 || otherShare <= 0 || otherShare >= 1 {
		t.Fatalf("shares %v, %v: pick other counts", share, otherShare)
	}
	read := func(ds *catalog.Dataset, indices []int) {
		t.Helper()
		for _, i := range indices {
			it, err := n.Get(ctx, ds, i)
			if err != nil {
				t.Fatal(err)
			}
			it.Release()
		}
	}
	m.ReportLoader(api.LoaderWait{Job: "j"})
	half := mine[:len(mine)/2]
	read(d, half) // from storage: this node owns them
	otherMine, _ := p.split(other)
	read(other, otherMine)
	m.ReportLoader(api.LoaderWait{Job: "j", Seconds: 1, StepSeconds: 1, Batches: 5, Items: 20, EpochEnd: true})

	plan, err := m.SplitPlan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	held := float64(len(half) * 256)
	if len(plan.Jobs) != 1 || plan.Jobs[0].MissBytes != uint64(held/share) {
		t.Fatalf("plan jobs %+v: want misses of %d (%v here at share %v)", plan.Jobs, uint64(held/share), held, share)
	}
	ds := plan.Datasets[0]
	if ds.CachedBytes != uint64(held/share) || ds.HitRatio != held/share/(40*256) {
		t.Fatalf("dataset %+v: want %d cached, hit ratio %v", ds, uint64(held/share), held/share/(40*256))
	}
	if rate := n.split.meter.Rate(d.ID); rate <= 0 || ds.StorageBytesPerS != rate/share {
		t.Fatalf("storage %v B/s for the cluster, measured %v here at share %v", ds.StorageBytesPerS, rate, share)
	}
	otherHeld := float64(n.store.DatasetBytes(other.ID))
	if otherHeld != float64(len(otherMine)*100) {
		t.Fatalf("the other dataset holds %v here", otherHeld)
	}
	want := (float64(m.ClusterMemory()) - otherHeld/otherShare) * 256 / (256 + store.EntryOverhead + 64)
	if plan.MemoryBytes != uint64(want) {
		t.Fatalf("memory to split %d, want %d", plan.MemoryBytes, uint64(want))
	}
	// The planner is fed these figures, scaled alike: its answer for them
	// is the plan's.
	exp := planner.Split(planner.Input{Memory: want,
		Datasets: map[string]planner.Dataset{"ds": {Name: "ds", Bytes: 40 * 256, StorageBps: ds.StorageBytesPerS,
			Cached: held / share, Current: held / share}},
		Jobs: []planner.Job{{Name: "j", Dataset: "ds", Ranks: 1, EpochS: 2, StepS: 1, Items: 20, Batches: 5, MissBytes: held / share}}})
	if len(exp.Jobs) != 1 || plan.Split["ds"] != uint64(exp.Split["ds"]) || plan.Jobs[0].EpochSPredicted != exp.Jobs[0].EpochSPredicted ||
		plan.Jobs[0].KneeBytes != uint64(exp.Jobs[0].KneeBytes) || plan.PredictedSaving != exp.Saving {
		t.Fatalf("plan %+v / %v, the planner's for the same figures %+v / %v", plan.Jobs, plan.Split, exp.Jobs, exp.Split)
	}
}

// --source-rate throttles storage to a known rate. A plan takes it for a
// dataset nothing was read from yet, and in place of a measured rate above
// it (a throttled source bursts after each pause), but keeps a measured
// rate below it.
func TestSourceRateCapsTheStorageRate(t *testing.T) {
	const limit = 1 << 50 // far above what reading the test's files reaches
	n, d, _ := startNodeWith(t, 8, 256, 64<<20, false, "lru", func(c *Config) { c.SourceRate = limit })
	ctx := context.Background()
	m := n.Split()
	addDataset(t, n, "idle", 4, 100)
	burst := addDataset(t, n, "burst", 4, 100)
	for _, ds := range []string{"ds", "idle", "burst"} {
		putJob(t, n, api.Job{Name: "j-" + ds, Dataset: ds, Seed: 1, WorldSize: 1, BatchSize: 4})
		m.ReportLoader(api.LoaderWait{Job: "j-" + ds})
	}
	for i := range d.Manifest.Len() {
		it, err := n.Get(ctx, d, i)
		if err != nil {
			t.Fatal(err)
		}
		it.Release()
	}
	// Petabytes in a moment: a burst no storage keeps up.
	for meter := n.split.meter; meter.Rate(burst.ID) <= limit; {
		meter.Start(burst.ID)
		meter.Done(burst.ID, 1<<52)
	}
	for _, ds := range []string{"ds", "idle", "burst"} {
		m.ReportLoader(api.LoaderWait{Job: "j-" + ds, Seconds: 1, StepSeconds: 1, Batches: 2, Items: 8, EpochEnd: true})
	}
	plan, err := m.SplitPlan(ctx)
	if err != nil {
		t.Fatal(err)
	}
	measured := n.split.meter.Rate(d.ID)
	if measured <= 0 || measured >= limit {
		t.Fatalf("measured %v B/s reading files: want between 0 and %v", measured, float64(limit))
	}
	want := map[string]float64{"ds": measured, "idle": limit, "burst": limit}
	for _, ds := range plan.Datasets {
		if ds.StorageBytesPerS != want[ds.Dataset] {
			t.Errorf("%s: %v B/s in the plan, want %v", ds.Dataset, ds.StorageBytesPerS, want[ds.Dataset])
		}
		delete(want, ds.Dataset)
	}
	if len(want) != 0 {
		t.Fatalf("datasets %v missing from the plan %+v", want, plan.Datasets)
	}
}

// A dataset of no items can be in a plan (a job reported an epoch over it):
// it has no item size, so the bookkeeping taken off the memory to split is
// the other datasets' alone.
func TestPlanWithAnEmptyDataset(t *testing.T) {
	n, _, _ := startNode(t, 4, 256, 64<<20, false)
	m := n.Split()
	addDataset(t, n, "empty", 0, 0)
	for _, ds := range []string{"ds", "empty"} {
		putJob(t, n, api.Job{Name: "j-" + ds, Dataset: ds, Seed: 1, WorldSize: 1, BatchSize: 4})
		m.ReportLoader(api.LoaderWait{Job: "j-" + ds})
		m.ReportLoader(api.LoaderWait{Job: "j-" + ds, Seconds: 1, StepSeconds: 1, Batches: 1, Items: 4, EpochEnd: true})
	}
	plan, err := m.SplitPlan(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(plan.Datasets) != 2 || len(plan.Jobs) != 2 {
		t.Fatalf("plan of %+v for jobs %+v: want both datasets and jobs", plan.Datasets, plan.Jobs)
	}
	if want := float64(m.ClusterMemory()) * 256 / (256 + store.EntryOverhead + 64); plan.MemoryBytes != uint64(want) {
		t.Fatalf("memory to split %d, want %d", plan.MemoryBytes, uint64(want))
	}
}
