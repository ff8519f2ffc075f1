package httpapi

import (
	"fmt"
	"sync"
	"testing"

	"stallfree/internal/testutil"
)

// Two jobs on one dataset, one an epoch ahead of the other: the clairvoyant
// policy reads both jobs' minibatches ahead from one schedule, so neither
// loader meets a miss, and reads no more from storage than MinIO does.
func TestClairvoyantTwoJobs(t *testing.T) {
	testutil.Long(t)
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
				job := fmt.Sprintf("j%d", j)
				for e := first; e < first+3; e++ {
					o, err := h.rankOrder(job, e, 0)
					if err != nil {
						t.Error(err)
						return
					}
					for b := range o.Batches {
						if pol == "clairvoyant" {
							if err := h.awaitReadAhead(o, b); err != nil {
								t.Error(err)
								return
							}
						}
						if r := h.do("GET", fmt.Sprintf("/v1/jobs/%s/epochs/%d/ranks/0/batches/%d", job, e, b), nil); r.status != 200 {
							t.Errorf("batch: %d", r.status)
							return
						}
					}
				}
			}()
		}
		wg.Wait()
		s := h.stats()
		res[pol] = result{s.SourceReads, s.Misses}
		t.Logf("%-11s two jobs, 3 epochs each: %d storage reads, %d loader misses of %d requests", pol, s.SourceReads, s.Misses, 6*items)
	}
	if c, m := res["clairvoyant"], res["minio"]; c.reads > m.reads || c.misses != 0 || m.misses == 0 {
		t.Fatalf("clairvoyant %+v vs MinIO %+v: want no more reads and no misses", c, m)
	}
}
