package httpapi

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"
)

// Issue 46: a derived dataset is made from a dataset read from a source: one
// derived from another is a bad request (400, not 409); a stage string with
// control or format characters is refused like a bad name (400), nothing
// registered; a quota on a derived dataset is refused (400) rather than
// enforced and shown nowhere, whether set later or in the derive request.
func TestDerivedDatasetRules(t *testing.T) {
	h := start(t, 4, 100, 64<<20, "minio", "")
	if r := h.do("PUT", "/v1/datasets/dec", []byte(`{"derived_from":"ds","stage":"decode"}`)); r.status != 201 {
		t.Fatalf("derive: %d %s", r.status, r.body)
	}
	if r := h.do("PUT", "/v1/datasets/dec2", []byte(`{"derived_from":"dec","stage":"again"}`)); r.status != 400 ||
		!strings.Contains(string(r.body), `derive from \"ds\"`) {
		t.Fatalf("derived from a derived dataset: %d %s; want 400 pointing at ds", r.status, r.body)
	}
	for _, stage := range []string{"red\x1b[31m", "a\nb", "bell\a", "rtl\u202eevil", "del\x7f", "c1\u009b"} {
		body, _ := json.Marshal(map[string]string{"derived_from": "ds", "stage": stage})
		if r := h.do("PUT", "/v1/datasets/esc", body); r.status != 400 {
			t.Fatalf("stage %q: %d %s; want 400", stage, r.status, r.body)
		}
	}
	if r := h.do("GET", "/v1/datasets/esc", nil); r.status != 404 {
		t.Fatalf("a refused stage registered a dataset: %d %s", r.status, r.body)
	}
	if r := h.do("PUT", "/v1/datasets/ok", []byte(`{"derived_from":"ds","stage":"decoded 224 (v1) – ünïcode"}`)); r.status != 201 {
		t.Fatalf("a printable stage with spaces and non-ASCII: %d %s", r.status, r.body)
	}
	if r := h.do("PUT", "/v1/datasets/dec", []byte(`{"quota": 1048576}`)); r.status != 400 || !strings.Contains(string(r.body), "quota on") {
		t.Fatalf("a quota on a derived dataset: %d %s; want 400", r.status, r.body)
	}
	if r := h.do("PUT", "/v1/datasets/dq", []byte(`{"derived_from":"ds","stage":"s","quota":1048576}`)); r.status != 400 {
		t.Fatalf("a derive with a quota: %d %s; want 400", r.status, r.body)
	}
	if r := h.do("GET", "/v1/datasets/dec", nil); r.status != 200 || strings.Contains(string(r.body), `"quota"`) {
		t.Fatalf("the derived dataset after the refused quota: %d %s", r.status, r.body)
	}
}

// Issue 47: PUT {"refresh": true} lists the source again: 200 and the same
// version while nothing changed, 201 and a new version once a file did; an
// item read from the old version's manifest after the change answers 409
// {"error": "source changed: KEY"}, and reads of the new version see the new
// bytes.
func TestRefreshAndSourceChanged(t *testing.T) {
	h := start(t, 3, 100, 64<<20, "minio", "")
	var before, after struct {
		Version uint64 `json:"version"`
		ID      uint32 `json:"id"`
	}
	r := h.do("PUT", "/v1/datasets/ds", []byte(`{"refresh": true}`))
	if err := json.Unmarshal(r.body, &before); r.status != 200 || err != nil || before.Version == 0 {
		t.Fatalf("refresh of an unchanged source: %d %s", r.status, r.body)
	}
	// Every key is changed and read: the names hold characters a URL must
	// escape, and each one must be found and refused.
	later := time.Now().Add(time.Hour)
	for key := range h.files {
		path := filepath.Join(h.data, filepath.FromSlash(key))
		if err := os.WriteFile(path, []byte("rewritten"), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, later, later); err != nil {
			t.Fatal(err)
		}
	}
	for key := range h.files {
		if r := h.do("GET", "/v1/datasets/ds/items/"+escapeKey(key), nil); r.status != 409 || string(r.body) != `{"error":"source changed: `+key+`"}` {
			t.Fatalf("a changed item %q, not held: %d %s; want 409 source changed", key, r.status, r.body)
		}
	}
	if r := h.do("PUT", "/v1/datasets/ds", []byte(`{"refresh": true, "source": "/elsewhere"}`)); r.status != 409 && r.status != 400 {
		t.Fatalf("a refresh naming another source: %d %s", r.status, r.body)
	}
	r = h.do("PUT", "/v1/datasets/ds", []byte(`{"refresh": true}`))
	if err := json.Unmarshal(r.body, &after); r.status != 201 || err != nil || after.Version <= before.Version || after.ID == before.ID {
		t.Fatalf("refresh after a change: %d %s; want 201 and a new version (was %+v)", r.status, r.body, before)
	}
	for key := range h.files {
		if r := h.do("GET", "/v1/datasets/ds/items/"+escapeKey(key), nil); r.status != 200 || string(r.body) != "rewritten" {
			t.Fatalf("the changed item %q after the refresh: %d %q", key, r.status, r.body)
		}
	}
	if r := h.do("PUT", "/v1/datasets/none", []byte(`{"refresh": true}`)); r.status != 404 {
		t.Fatalf("refresh of no dataset: %d %s", r.status, r.body)
	}
}

// POST batch?map=1 is for a loader on the node's host, over its Unix socket:
// over TCP there is nothing to map (204, nothing sent), and bad indices are
// refused as for any batch.
func TestBatchMapOverTCP(t *testing.T) {
	h := start(t, 3, 100, 64<<20, "minio", "")
	if r := h.do("POST", "/v1/datasets/ds/batch?map=1", []byte(`{"indices":[0,1]}`)); r.status != 204 || len(r.body) != 0 {
		t.Fatalf("batch?map=1 over TCP: %d %q; want 204 and nothing", r.status, r.body)
	}
	if r := h.do("POST", "/v1/datasets/ds/batch?map=1", []byte(`{"indices":[0,9]}`)); r.status != 400 {
		t.Fatalf("batch?map=1 with an index out of range: %d %s", r.status, r.body)
	}
}

// POST batch?partial=1 on a derived dataset answers the written items and
// nil for the others, where a plain batch is a 404 for the whole: a loader
// learns in one request what it has to compute. Anywhere else partial is a
// bad request.
func TestPartialBatchOfADerivedDataset(t *testing.T) {
	h := start(t, 3, 100, 64<<20, "minio", "")
	if r := h.do("PUT", "/v1/datasets/dec", []byte(`{"derived_from":"ds","stage":"decode"}`)); r.status != 201 {
		t.Fatalf("derive: %d %s", r.status, r.body)
	}
	if r := h.do("PUT", "/v1/datasets/dec/index/1", []byte("second")); r.status != 201 {
		t.Fatalf("write: %d %s", r.status, r.body)
	}
	if r := h.do("POST", "/v1/datasets/dec/batch", []byte(`{"indices":[0,1]}`)); r.status != 404 {
		t.Fatalf("a plain batch with an item not written: %d %s", r.status, r.body)
	}
	r := h.do("POST", "/v1/datasets/dec/batch?partial=1", []byte(`{"indices":[0,1,2,1]}`))
	var got []*struct {
		Key  string `msgpack:"key"`
		Data []byte `msgpack:"data"`
	}
	if err := msgpack.Unmarshal(r.body, &got); r.status != 200 || err != nil || len(got) != 4 {
		t.Fatalf("partial batch: %d %v %q", r.status, err, r.body)
	}
	for j, want := range []string{"", "second", "", "second"} {
		if (got[j] == nil) != (want == "") || (got[j] != nil && string(got[j].Data) != want) {
			t.Fatalf("item %d of the partial batch: %+v, want %q", j, got[j], want)
		}
	}
	for _, path := range []string{"/v1/datasets/ds/batch?partial=1", "/v1/datasets/dec/batch?partial=yes"} {
		if r := h.do("POST", path, []byte(`{"indices":[0]}`)); r.status != 400 {
			t.Fatalf("%s: %d %s; want 400", path, r.status, r.body)
		}
	}
}
