package node

import (
	"context"
	"testing"

	"stallfree/api"
	"stallfree/internal/testutil"
)

// A job's served-items series go when the job is deleted: they were kept for
// every job ever served (the attack round left 38,768 series of four deleted
// jobs on /metrics).
func TestJobSeriesGoWithTheJob(t *testing.T) {
	n, _, _ := startNodeWith(t, 8, 1<<10, 64<<20, false, "lru")
	ctx := context.Background()
	for _, job := range []string{"kept", "gone"} {
		if _, err := n.Control().PutJob(ctx, api.Job{Name: job, Dataset: "ds", Seed: 1, WorldSize: 2, BatchSize: 2}); err != nil {
			t.Fatal(err)
		}
		for rank := range 2 {
			items, _, err := n.JobBatch(ctx, job, 0, rank, 0)
			if err != nil {
				t.Fatal(err)
			}
			for i := range items {
				items[i].Release()
			}
		}
	}
	// job/rank/result → items, as /metrics shows them.
	served := func() map[string]float64 {
		out := map[string]float64{}
		fams, err := n.Registry().Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() != "stallfree_job_items_total" {
				continue
			}
			for _, m := range f.GetMetric() {
				var key string
				for _, l := range m.GetLabel() {
					key += "/" + l.GetValue()
				}
				out[key[1:]] = m.GetCounter().GetValue()
			}
		}
		return out
	}
	series := func() int { return len(served()) }
	if got := series(); got != 4 { // 2 jobs × 2 ranks, every item a miss on first read
		t.Fatalf("%d series after two jobs of two ranks; want 4", got)
	}
	if err := n.Control().DeleteJob(ctx, "gone"); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "the deleted job's series to go", func() bool { return series() == 2 })
	if got := served(); got["kept/0/miss"] != 2 || got["kept/1/miss"] != 2 {
		t.Fatalf("the kept job's series: %v; want 2 misses for each rank", got)
	}
}
