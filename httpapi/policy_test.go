package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

type epochResult struct {
	reads, misses, requests uint64
}

// runJobEpochs reads epochs in the job's order, batch by batch, pausing per
// batch as a GPU would, and returns storage reads and loader misses per epoch.
func (h *harness) runJobEpochs(epochs int, pause time.Duration) []epochResult {
	h.t.Helper()
	var out []epochResult
	for e := range epochs {
		var o struct {
			Indices []int `json:"indices"`
			Batches int   `json:"batches"`
		}
		r := h.do("GET", fmt.Sprintf("/v1/jobs/j/epochs/%d/ranks/0", e), nil)
		if r.status != 200 {
			h.t.Fatalf("order: %d %s", r.status, r.body)
		}
		json.Unmarshal(r.body, &o)
		before := h.stats()
		for b := range o.Batches {
			r := h.do("GET", fmt.Sprintf("/v1/jobs/j/epochs/%d/ranks/0/batches/%d", e, b), nil)
			var items []struct {
				Key  string `msgpack:"key"`
				Data []byte `msgpack:"data"`
			}
			if r.status != 200 || msgpack.Unmarshal(r.body, &items) != nil {
				h.t.Fatalf("batch %d: %d", b, r.status)
			}
			for _, it := range items {
				if !bytes.Equal(it.Data, h.files[it.Key]) {
					h.t.Fatalf("wrong bytes for %s", it.Key)
				}
			}
			time.Sleep(pause)
		}
		after := h.stats()
		out = append(out, epochResult{reads: after.SourceReads - before.SourceReads, misses: after.Misses - before.Misses,
			requests: uint64(len(o.Indices))})
	}
	return out
}

func TestPoliciesOnJobOrder(t *testing.T) {
	// Equal sizes: the comparison is about which items are kept, not how
	// many bytes each policy manages to pack.
	const items, size = 600, 8192
	dir, files := writeFiles(t, items, func() int { return size })
	memory := uint64(items / 2 * (size + 128))
	res := map[string][]epochResult{}
	for _, pol := range []string{"minio", "lru", "clairvoyant"} {
		h := startOn(t, dir, files, memory, pol, "")
		if r := h.do("PUT", "/v1/jobs/j", []byte(`{"dataset":"ds","seed":5,"world_size":1,"batch_size":20,"ranks":["t1"]}`)); r.status != 200 {
			t.Fatalf("job: %d %s", r.status, r.body)
		}
		res[pol] = h.runJobEpochs(3, 15*time.Millisecond)
		t.Logf("%-11s storage reads per epoch %d %d %d; loader misses %d %d %d of %d", pol,
			res[pol][0].reads, res[pol][1].reads, res[pol][2].reads, res[pol][0].misses, res[pol][1].misses, res[pol][2].misses, res[pol][0].requests)
	}
	for e := 1; e < 3; e++ {
		m, l, c := res["minio"][e], res["lru"][e], res["clairvoyant"][e]
		if m.reads < items*40/100 || m.reads > items*60/100 {
			t.Errorf("epoch %d: MinIO read %d, want about half of %d", e, m.reads, items)
		}
		if l.reads <= m.reads {
			t.Errorf("epoch %d: LRU read %d, not more than MinIO's %d", e, l.reads, m.reads)
		}
		if c.reads > m.reads {
			t.Errorf("epoch %d: clairvoyant read %d, more than MinIO's %d", e, c.reads, m.reads)
		}
	}
	// The first epoch starts cold: its first batch cannot have been read
	// ahead. Over the run, and in every later epoch, at most 5% may miss.
	var misses, requests uint64
	for e, c := range res["clairvoyant"] {
		misses += c.misses
		requests += c.requests
		if e > 0 && float64(c.misses) > 0.05*float64(c.requests) {
			t.Errorf("epoch %d: clairvoyant loader saw %d misses of %d requests (> 5%%)", e, c.misses, c.requests)
		}
	}
	if float64(misses) > 0.05*float64(requests) {
		t.Errorf("clairvoyant loader saw %d misses of %d requests (> 5%%)", misses, requests)
	}
}
