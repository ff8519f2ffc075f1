package integration

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"

	"stallfree/client"
	"stallfree/internal/testutil"
	"stallfree/stall"
)

// cachectl analyze's method against a real node with storage throttled like
// a disk. What is asserted is what the model rests on, not how fast this
// machine is: the cold pass reads storage for every sampled item and caches
// none; the stalls reported are the model's for the measured rates; and a
// node with memory for half the dataset hits exactly the items it holds
// (MinIO's hit rate is its cached fraction) and reads the rest from storage.
// How close the predicted epoch time comes to a measured one is a benchmark
// figure (`make bench`, section "cachectl analyze").
func TestAnalyzeModelOnARealNode(t *testing.T) {
	testutil.Long(t)
	const items, size, rate, sample = 400, 16 << 10, "4MB", 200
	dir, files := dataset(t, items, size)
	var total int64
	for _, b := range files {
		total += int64(len(b))
	}
	ctx := context.Background()
	full := startNode(t, nodeOpts{name: "full", bootstrap: true, memory: "64MiB", extra: []string{"--source-rate", rate}})
	register(t, full, "ds", dir)
	an, err := stall.Analyze(ctx, full.c, []*client.Client{full.c}, "ds", sample, 8, 600)
	if err != nil {
		t.Fatal(err)
	}
	m := an.Model
	t.Logf("rates: memory %.0f, cached %.0f, cold %.0f items/s; stall cold %.2fs, cached %.2fs", m.Rates.Memory, m.Rates.Cached, m.Rates.Cold, an.ColdStall, an.WarmStall)
	if m.Items != items || m.Bytes != total {
		t.Fatalf("model of %d items, %d bytes; the dataset has %d, %d", m.Items, m.Bytes, items, total)
	}
	if want := m.Predict("minio", 0).StallSeconds; an.ColdStall != want {
		t.Errorf("cold stall %v, the model says %v", an.ColdStall, want)
	}
	if want := m.Predict("minio", 1).StallSeconds; an.WarmStall != want {
		t.Errorf("cached stall %v, the model says %v", an.WarmStall, want)
	}
	s := mustStats(t, full)
	// The cold pass bypasses the cache (one storage read per sampled item);
	// the warm-up then reads every item once and caches it.
	if s.SourceReads != sample+items || s.ItemsCached != items {
		t.Errorf("after analyze: %d storage reads (want %d sampled + %d warmed), %d items cached (want %d)", s.SourceReads, sample, items, s.ItemsCached, items)
	}

	// Half the memory (payload plus the store's per-item charge), MinIO.
	half := (total + items*(64+128)) / 2
	n := startNode(t, nodeOpts{name: "half", bootstrap: true, memory: itoa(half), extra: []string{"--source-rate", rate}})
	register(t, n, "ds", dir)
	for e := range 2 {
		before := mustStats(t, n)
		order := rand.New(rand.NewPCG(uint64(e), 5)).Perm(items)
		rd, err := stall.Read(ctx, n.c, "ds", order, stall.ReadOptions{Workers: 8})
		if err != nil {
			t.Fatal(err)
		}
		after := mustStats(t, n)
		if e == 0 {
			if after.ItemsCached == 0 || after.ItemsCached >= items {
				t.Fatalf("half memory holds %d of %d items after the first epoch", after.ItemsCached, items)
			}
			continue
		}
		hits, reads := rd.Count("hit"), after.SourceReads-before.SourceReads
		t.Logf("half memory: %d of %d items cached, %d hits, %d storage reads; epoch %.2fs measured, %.2fs predicted for that hit rate",
			after.ItemsCached, items, hits, reads, rd.Elapsed.Seconds(), m.FetchSeconds(float64(hits)/items))
		if hits != before.ItemsCached || int(reads) != items-hits || after.ItemsCached != before.ItemsCached {
			t.Errorf("second epoch: %d hits with %d items cached, %d storage reads for %d misses, %d cached after: MinIO's hit rate is not its cached fraction",
				hits, before.ItemsCached, reads, items-hits, after.ItemsCached)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
