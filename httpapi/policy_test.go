package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
	"stallfree/internal/testutil"
)

type epochResult struct {
	reads, misses, requests uint64
}

// rankOrder fetches a rank's order of an epoch of a job.
// It returns errors rather than failing the test: loaders run on their own
// goroutines.
func (h *harness) rankOrder(job string, epoch, rank int) (api.RankOrder, error) {
	r := h.do("GET", fmt.Sprintf("/v1/jobs/%s/epochs/%d/ranks/%d", job, epoch, rank), nil)
	var o api.RankOrder
	if r.status != 200 {
		return o, fmt.Errorf("order of %s epoch %d rank %d: %d %s", job, epoch, rank, r.status, r.body)
	}
	if err := json.Unmarshal(r.body, &o); err != nil {
		return o, fmt.Errorf("order of %s epoch %d rank %d: %w", job, epoch, rank, err)
	}
	return o, nil
}

// awaitReadAhead waits until the node holds every item of minibatch b: a
// loader that gives the read-ahead the time it needs, decided by what the
// node holds rather than by a pause that a busy machine may overrun.
func (h *harness) awaitReadAhead(o api.RankOrder, b int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d, err := h.node.Control().Dataset(ctx, "ds")
	if err != nil {
		return err
	}
	batch := o.Indices[b*o.BatchSize : min((b+1)*o.BatchSize, len(o.Indices))]
	for {
		missing := 0
		for _, i := range batch {
			if !h.node.Split().Holds(d, i) {
				missing++
			}
		}
		if missing == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("read-ahead never brought in minibatch %d of epoch %d: %d of %d items missing", b, o.Epoch, missing, len(batch))
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// runJobEpochs reads epochs in the job's order, batch by batch, and returns
// storage reads and loader misses per epoch. With readAhead the loader waits
// for the policy's read-ahead of each minibatch before asking for it.
func (h *harness) runJobEpochs(epochs int, readAhead bool) []epochResult {
	h.t.Helper()
	var out []epochResult
	for e := range epochs {
		o, err := h.rankOrder("j", e, 0)
		if err != nil {
			h.t.Fatal(err)
		}
		before := h.stats()
		for b := range o.Batches {
			if readAhead {
				if err := h.awaitReadAhead(o, b); err != nil {
					h.t.Fatal(err)
				}
			}
			r := h.do("GET", fmt.Sprintf("/v1/jobs/j/epochs/%d/ranks/0/batches/%d", e, b), nil)
			var items []struct {
				Key  string `msgpack:"key"`
				Data []byte `msgpack:"data"`
			}
			if r.status != 200 {
				h.t.Fatalf("batch %d: %d", b, r.status)
			}
			if err := msgpack.Unmarshal(r.body, &items); err != nil {
				h.t.Fatalf("batch %d: %v", b, err)
			}
			for _, it := range items {
				if !bytes.Equal(it.Data, h.files[it.Key]) {
					h.t.Fatalf("wrong bytes for %s", it.Key)
				}
			}
		}
		after := h.stats()
		out = append(out, epochResult{reads: after.SourceReads - before.SourceReads, misses: after.Misses - before.Misses,
			requests: uint64(len(o.Indices))})
	}
	return out
}

func TestPoliciesOnJobOrder(t *testing.T) {
	testutil.Long(t)
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
		res[pol] = h.runJobEpochs(3, pol == "clairvoyant")
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
		// Belady's rule keeps what the schedule needs soonest: it never reads
		// more than MinIO, which keeps an arbitrary half.
		if c.reads > m.reads {
			t.Errorf("epoch %d: clairvoyant read %d, more than MinIO's %d", e, c.reads, m.reads)
		}
		// Read ahead, nothing the loader asks for is a miss; without it (MinIO
		// and LRU) every storage read is one.
		if c.misses != 0 || m.misses != m.reads {
			t.Errorf("epoch %d: loader misses: clairvoyant %d (want 0), MinIO %d (want its %d reads)", e, c.misses, m.misses, m.reads)
		}
	}
}
