package httpapi

import (
	"encoding/json"
	"fmt"
	"math"
	"testing"

	"stallfree/api"
)

// pass reads every index of ds once and returns the sizes of the items
// that were hits (held in memory when asked).
func (h *harness) pass(ds string, n int) (hitBytes int64, hits int) {
	h.t.Helper()
	for i := range n {
		r := h.do("GET", fmt.Sprintf("/v1/datasets/%s/index/%d", ds, i), nil)
		if r.status != 200 {
			h.t.Fatalf("%s index %d: %d %s", ds, i, r.status, r.body)
		}
		if r.header.Get("X-Cache") == "hit" {
			hitBytes += int64(len(r.body))
			hits++
		}
	}
	return hitBytes, hits
}

func (h *harness) info(ds string) api.Dataset {
	h.t.Helper()
	var d api.Dataset
	r := h.do("GET", "/v1/datasets/"+ds, nil)
	if r.status != 200 {
		h.t.Fatalf("GET dataset %s: %d %s", ds, r.status, r.body)
	}
	if err := json.Unmarshal(r.body, &d); err != nil {
		h.t.Fatal(err)
	}
	return d
}

func (h *harness) putQuota(ds string, body string) reply {
	h.t.Helper()
	return h.do("PUT", "/v1/datasets/"+ds, []byte(body))
}

func quotaOf(d api.Dataset) int64 {
	if d.Quota == nil {
		return -1
	}
	return int64(*d.Quota)
}

// Quotas through PUT /v1/datasets/{name}: each dataset holds at most its
// quota (and no less than one item under it, MinIO filling up), after
// setting, shrinking and growing; bad quotas are 400s and change nothing.
func TestDatasetQuotas(t *testing.T) {
	const items, size = 120, 8 << 10
	h := start(t, items, size, 4<<20, "minio", "")
	dir2, _ := writeDataset(t, items+1, size)
	maxItem := int64(size + size/2)

	// A new dataset with its quota, and a quota on an existing one.
	r := h.putQuota("ds2", fmt.Sprintf(`{"source": %q, "quota": 300000}`, dir2))
	if r.status != 201 {
		t.Fatalf("new dataset with a quota: %d %s", r.status, r.body)
	}
	if d := h.info("ds2"); quotaOf(d) != 300000 || d.Items != items+1 {
		t.Fatalf("ds2 info %+v", d)
	}
	if r := h.putQuota("ds", `{"quota": 400000}`); r.status != 200 {
		t.Fatalf("quota on an existing dataset: %d %s", r.status, r.body)
	}
	if d := h.info("ds"); quotaOf(d) != 400000 || d.Source == "" {
		t.Fatalf("ds info %+v", d)
	}

	// Bad input: a clear 400 (404 for an unknown dataset), nothing changed.
	for _, bad := range []struct {
		ds, body string
		code     int
	}{
		{"ds", `{"quota": -1}`, 400},
		{"ds", `{"quota": "4GiB"}`, 400},
		{"ds", `{"quota": 1.5}`, 400},
		{"ds", `{"quota": 99999999999999999999}`, 400},
		{"ds", fmt.Sprintf(`{"quota": %d}`, 4<<20+1), 400}, // over the cluster's memory
		{"ds", `{"quota": 1000, "extra": 1}`, 400},
		{"nope", `{"quota": 1000}`, 404},
	} {
		r := h.putQuota(bad.ds, bad.body)
		var e struct{ Error string }
		if r.status != bad.code || json.Unmarshal(r.body, &e) != nil || e.Error == "" {
			t.Errorf("PUT %s %s: %d %s; want %d with a JSON error", bad.ds, bad.body, r.status, r.body, bad.code)
		}
	}
	if quotaOf(h.info("ds")) != 400000 || quotaOf(h.info("ds2")) != 300000 {
		t.Fatal("a refused quota changed a dataset's quota")
	}
	if r := h.do("GET", "/v1/datasets/nope", nil); r.status != 404 {
		t.Fatal("a refused quota registered a dataset")
	}

	// held checks what a pass finds cached against the quota: at most the
	// quota, and within one item of it (MinIO fills until the next item
	// would not fit).
	held := func(ds string, n int, quota int64) (hits int) {
		t.Helper()
		h.pass(ds, n) // fill: every miss is offered to the store
		got, hits := h.pass(ds, n)
		if got > quota || got < quota-maxItem {
			t.Fatalf("%s holds %d bytes (%d items) under a quota of %d; want within one item below it", ds, got, hits, quota)
		}
		return hits
	}
	held("ds", items, 400000)
	held("ds2", items+1, 300000)

	// Shrink ds: random items of it go, ds2 keeps what it had.
	if r := h.putQuota("ds", `{"quota": 150000}`); r.status != 200 {
		t.Fatalf("shrink: %d %s", r.status, r.body)
	}
	got, _ := h.pass("ds", items)
	if got > 150000 || got < 150000-maxItem {
		t.Fatalf("after shrinking, ds holds %d bytes; want at most 150000, within one item", got)
	}
	if got, _ := h.pass("ds2", items+1); got > 300000 || got < 300000-maxItem {
		t.Fatalf("shrinking ds changed ds2: %d bytes", got)
	}
	// Grow ds2: its misses fill the new room.
	if r := h.putQuota("ds2", `{"quota": 700000}`); r.status != 200 {
		t.Fatalf("grow: %d %s", r.status, r.body)
	}
	held("ds2", items+1, 700000)
	held("ds", items, 150000)
	if s := h.stats(); s.BytesCached > 150000+700000 {
		t.Fatalf("the store holds %d bytes under quotas of 850000", s.BytesCached)
	}
	// null lifts a quota: the dataset fills up with its next misses.
	if r := h.putQuota("ds", `{"quota": null}`); r.status != 200 {
		t.Fatalf("lift: %d %s", r.status, r.body)
	}
	if d := h.info("ds"); d.Quota != nil {
		t.Fatalf("after a lift ds shows quota %d", *d.Quota)
	}
	h.pass("ds", items)
	if got, hits := h.pass("ds", items); hits != items || got != h.info("ds").Bytes {
		t.Fatalf("with its quota lifted ds holds %d items (%d bytes) of %d", hits, got, items)
	}
}

// Stall-meter reports with step time make a plan; applying it sets the
// quotas of its split.
func TestPlanFromReportsAndApply(t *testing.T) {
	const items, size = 100, 8 << 10
	h := start(t, items, size, 2<<20, "minio", "")
	dir2, _ := writeDataset(t, items+1, size)
	if r := h.putQuota("ds2", fmt.Sprintf(`{"source": %q, "quota": 500000}`, dir2)); r.status != 201 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	if r := h.putQuota("ds", `{"quota": 500000}`); r.status != 200 {
		t.Fatalf("%d %s", r.status, r.body)
	}
	report := func(body string) {
		t.Helper()
		if r := h.do("POST", "/v1/loader/wait", []byte(body)); r.status != 204 {
			t.Fatalf("report %s: %d %s", body, r.status, r.body)
		}
	}
	if r := h.do("POST", "/v1/plan/apply", nil); r.status != 409 {
		t.Fatalf("apply with no reports: %d %s; want 409", r.status, r.body)
	}
	for _, bad := range []string{`{"seconds": 1, "step_seconds": -1}`, `{"seconds": 1, "items": -3}`, `{"seconds": 1, "epoch_end": "yes"}`} {
		if r := h.do("POST", "/v1/loader/wait", []byte(bad)); r.status != 400 {
			t.Errorf("report %s: %d; want 400", bad, r.status)
		}
	}
	// Two epochs of two jobs: "io" waits for every batch and computes
	// nothing, "gpu" computes for far longer than its reads take.
	for range 2 {
		report(`{"seconds": 0, "batches": 0, "job": "io", "rank": 0, "dataset": "ds"}`)
		report(`{"seconds": 0, "batches": 0, "job": "gpu", "rank": 0, "dataset": "ds2"}`)
		h.pass("ds", items)
		h.pass("ds2", items+1)
		report(`{"seconds": 5, "step_seconds": 0.01, "batches": 10, "items": 100, "job": "io", "rank": 0, "dataset": "ds", "epoch_end": true}`)
		report(`{"seconds": 0.05, "step_seconds": 50, "batches": 10, "items": 101, "job": "gpu", "rank": 0, "dataset": "ds2", "epoch_end": true}`)
	}
	var p api.Plan
	r := h.do("GET", "/v1/plan", nil)
	if r.status != 200 || json.Unmarshal(r.body, &p) != nil {
		t.Fatalf("plan: %d %s", r.status, r.body)
	}
	var raw map[string]any
	json.Unmarshal(r.body, &raw)
	for _, f := range []string{"job", "dataset", "epoch_s", "epoch_s_predicted", "cached_bytes", "knee_bytes", "seconds_saved_per_gib"} {
		if _, ok := raw["jobs"].([]any)[0].(map[string]any)[f]; !ok {
			t.Errorf("plan jobs lack %q: %s", f, r.body)
		}
	}
	if len(p.Jobs) != 2 || p.Jobs[0].Job != "gpu" || p.Jobs[1].Job != "io" {
		t.Fatalf("plan jobs %+v", p.Jobs)
	}
	gpu, io := p.Jobs[0], p.Jobs[1]
	dsBytes := uint64(h.info("ds").Bytes)
	if io.EpochS != 5.01 || io.KneeBytes != dsBytes || io.CachedBytes == 0 || io.CachedBytes > 500000 {
		t.Fatalf("io row %+v; want the measured 5.01 s, the whole dataset as its knee", io)
	}
	if gpu.EpochS != 50.05 || gpu.KneeBytes >= uint64(h.info("ds2").Bytes) || gpu.SecondsSavedPerGiB >= io.SecondsSavedPerGiB ||
		math.Abs(gpu.EpochSNow-gpu.EpochS) > 1e-6*gpu.EpochS {
		t.Fatalf("gpu row %+v; want its knee below its dataset, less saved by more than io, the measured epoch fitted", gpu)
	}
	if p.Split["ds"] != dsBytes || p.Split["ds"]+p.Split["ds2"] > p.MemoryBytes || p.MemoryBytes > 2<<20 {
		t.Fatalf("split %v of %d bytes; want all of ds (%d) to the io job", p.Split, p.MemoryBytes, dsBytes)
	}
	if io.EpochSPredicted >= io.EpochS || p.PredictedSaving <= 0 {
		t.Fatalf("io predicted %g s, saving %g; want faster", io.EpochSPredicted, p.PredictedSaving)
	}

	r = h.do("POST", "/v1/plan/apply", nil)
	var applied api.Plan
	if r.status != 200 || json.Unmarshal(r.body, &applied) != nil || !applied.Applied {
		t.Fatalf("apply: %d %s", r.status, r.body)
	}
	for ds, want := range applied.Split {
		if got := quotaOf(h.info(ds)); got != int64(want) {
			t.Errorf("%s quota %d after apply; want the split's %d", ds, got, want)
		}
	}
	if got, _ := h.pass("ds", items); got > int64(applied.Split["ds"]) {
		t.Fatalf("ds holds %d bytes over its new quota", got)
	}
	if r := h.do("GET", "/v1/plan/nope", nil); r.status != 404 {
		t.Fatalf("GET /v1/plan/nope: %d", r.status)
	}
	if r := h.do("PUT", "/v1/plan", nil); r.status != 405 {
		t.Fatalf("PUT /v1/plan: %d", r.status)
	}
}
