package integration

import (
	"context"
	"math"
	"math/rand/v2"
	"strconv"
	"testing"

	"stallfree/client"
	"stallfree/stall"
)

// cachectl analyze's method against a source throttled like a disk: a cold
// epoch stalls a fast GPU, a cached one does not, and the prediction for half
// the memory matches a run with half the memory within 15%.
func TestAnalyzePredictsHalfMemory(t *testing.T) {
	const items, size, rate = 400, 16 << 10, "4MB"
	dir, files := dataset(t, items, size)
	var total int64
	for _, b := range files {
		total += int64(len(b))
	}
	ctx := context.Background()
	full := startNode(t, nodeOpts{name: "full", bootstrap: true, memory: "64MiB", extra: []string{"--source-rate", rate}})
	register(t, full, "ds", dir)
	// A GPU at 600 items/s: well above the throttled storage (~240 items/s)
	// and, even on a busy CI machine, well below cached reads (~2000).
	an, err := stall.Analyze(ctx, full.c, []*client.Client{full.c}, "ds", 200, 8, 600)
	if err != nil {
		t.Fatal(err)
	}
	r := an.Model.Rates
	t.Logf("rates: memory %.0f, cached %.0f, cold %.0f items/s; stall cold %.2fs, cached %.2fs", r.Memory, r.Cached, r.Cold, an.ColdStall, an.WarmStall)
	if an.ColdStall <= 0 || an.WarmStall != 0 {
		t.Fatalf("want a stall cold and none cached: %.2fs / %.2fs", an.ColdStall, an.WarmStall)
	}
	predicted := an.Model.FetchSeconds(0.5)

	// Half the memory (payload plus the store's per-item charge), MinIO.
	half := (total + items*(64+128)) / 2
	n := startNode(t, nodeOpts{name: "half", bootstrap: true, memory: itoa(half), extra: []string{"--source-rate", rate}})
	register(t, n, "ds", dir)
	for e := range 2 {
		order := rand.New(rand.NewPCG(uint64(e), 5)).Perm(items)
		rd, err := stall.Read(ctx, n.c, "ds", order, stall.ReadOptions{Workers: 8})
		if err != nil {
			t.Fatal(err)
		}
		if e == 0 {
			continue // fills the cache
		}
		s := mustStats(t, n)
		measured := rd.Elapsed.Seconds()
		t.Logf("half memory: %d of %d items cached; epoch %.2fs measured, %.2fs predicted", s.ItemsCached, items, measured, predicted)
		if diff := math.Abs(measured-predicted) / measured; diff > 0.15 {
			t.Fatalf("prediction %.2fs is %.0f%% off the measured %.2fs", predicted, 100*diff, measured)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
