package httpapi

import (
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"
)

// Two jobs on one dataset, one an epoch ahead of the other: the clairvoyant
// policy serves both from one schedule and reads no more from storage than
// MinIO, with fewer loader-seen misses.
func TestClairvoyantTwoJobs(t *testing.T) {
	const items, size = 400, 8192
	dir, files := writeFiles(t, items, func() int { return size })
	memory := uint64(items / 2 * (size + 128))
	type result struct{ reads, misses uint64 }
	res := map[string]result{}
	for _, pol := range []string{"minio", "clairvoyant"} {
		h := startOn(t, dir, files, memory, pol, "")
		for j, seed := range []int{5, 6} {
			body := fmt.Sprintf(`{"dataset":"ds","seed":%d,"world_size":1,"batch_size":20,"ranks":["t1"]}`, seed)
			if r := h.do("PUT", fmt.Sprintf("/v1/jobs/j%d", j), []byte(body)); r.status != 200 {
				t.Fatalf("job: %d %s", r.status, r.body)
			}
		}
		var wg sync.WaitGroup
		for j, first := range []int{0, 1} { // j1 starts an epoch ahead
			wg.Add(1)
			go func() {
				defer wg.Done()
				for e := first; e < first+3; e++ {
					var o struct{ Batches int }
					json.Unmarshal(h.do("GET", fmt.Sprintf("/v1/jobs/j%d/epochs/%d/ranks/0", j, e), nil).body, &o)
					for b := range o.Batches {
						if r := h.do("GET", fmt.Sprintf("/v1/jobs/j%d/epochs/%d/ranks/0/batches/%d", j, e, b), nil); r.status != 200 {
							t.Errorf("batch: %d", r.status)
							return
						}
						time.Sleep(15 * time.Millisecond)
					}
				}
			}()
		}
		wg.Wait()
		s := h.stats()
		res[pol] = result{s.SourceReads, s.Misses}
		t.Logf("%-11s two jobs, 3 epochs each: %d storage reads, %d loader misses of %d requests", pol, s.SourceReads, s.Misses, 6*items)
	}
	if c, m := res["clairvoyant"], res["minio"]; c.reads > m.reads || c.misses >= m.misses {
		t.Fatalf("clairvoyant %+v vs MinIO %+v", c, m)
	}
}
