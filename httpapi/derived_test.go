package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/valyala/fasthttp"
	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
	"stallfree/node"
	"stallfree/relay"
)

// An item write may exceed the 1 MiB every other body is held to (up to
// --max-item-bytes); a batch request of that size still gets 413, and a
// derived item the token does not cover is refused like any other call.
func TestDerivedItemBodies(t *testing.T) {
	h := start(t, 8, 1000, 64<<20, "minio", "sekrit")
	if r := h.do("PUT", "/v1/datasets/dec", []byte(`{"derived_from":"ds","stage":"big"}`)); r.status != 201 {
		t.Fatalf("derive: %d %s", r.status, r.body)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 3<<16) // 3 MiB
	if r := h.do("PUT", "/v1/datasets/dec/index/2", big); r.status != 201 {
		t.Fatalf("a 3 MiB item: %d %s", r.status, r.body)
	}
	if r := h.do("GET", "/v1/datasets/dec/index/2", nil); r.status != 200 || !bytes.Equal(r.body, big) {
		t.Fatalf("reading it back: %d, %d bytes", r.status, len(r.body))
	}
	if r := h.do("GET", "/v1/datasets/dec/index/3", nil); r.status != 404 || string(r.body) != `{"error":"not written"}` {
		t.Fatalf("unwritten: %d %s", r.status, r.body)
	}
	if r := h.do("POST", "/v1/datasets/ds/batch", big); r.status != 413 {
		t.Fatalf("a 3 MiB batch request: %d %s", r.status, r.body)
	}
	if r := h.do("PUT", "/v1/datasets/dec/index/4", []byte("x"), "Authorization", "Bearer wrong"); r.status != 401 {
		t.Fatalf("wrong token: %d", r.status)
	}
	if r := h.do("POST", "/v1/datasets/dec/warmup", nil); r.status != 400 {
		t.Fatalf("warming a derived dataset: %d %s", r.status, r.body)
	}
	var info struct {
		Written *int  `json:"written"`
		Bytes   int64 `json:"bytes"`
	}
	r := h.do("GET", "/v1/datasets/dec", nil)
	if err := json.Unmarshal(r.body, &info); err != nil || info.Written == nil || *info.Written != 1 || info.Bytes != int64(len(big)) {
		t.Fatalf("info: %s %v", r.body, err)
	}
}

// PUT …/batch writes several items of a derived dataset in one request and
// answers what became of each, in order; a body that is no array of
// {index, data}, or that holds one bad item, is refused whole and writes
// nothing.
func TestDerivedBatchWrites(t *testing.T) {
	h := start(t, 8, 1000, 64<<20, "minio", "sekrit")
	if r := h.do("PUT", "/v1/datasets/dec", []byte(`{"derived_from":"ds","stage":"batch"}`)); r.status != 201 {
		t.Fatalf("derive: %d %s", r.status, r.body)
	}
	written := func() int {
		var info struct {
			Written int `json:"written"`
		}
		r := h.do("GET", "/v1/datasets/dec", nil)
		if err := json.Unmarshal(r.body, &info); err != nil {
			t.Fatalf("info: %s %v", r.body, err)
		}
		return info.Written
	}
	pack := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for name, body := range map[string][]byte{
		"not msgpack":     []byte("{}"),
		"a map":           pack(map[string]int{"index": 1}),
		"an unknown key":  pack([]map[string]any{{"index": 1, "data": []byte("x"), "extra": 1}}),
		"empty":           pack([]api.ItemWrite{}),
		"out of range":    pack([]api.ItemWrite{{Index: 1, Data: []byte("x")}, {Index: 8, Data: []byte("y")}}),
		"a negative one":  pack([]api.ItemWrite{{Index: 1, Data: []byte("x")}, {Index: -1, Data: []byte("y")}}),
		"trailing data":   append(pack([]api.ItemWrite{{Index: 1, Data: []byte("x")}}), 0xc0),
		"over the limits": pack([]api.ItemWrite{{Index: 1, Data: []byte("x")}, {Index: 2, Data: make([]byte, 65<<20)}}),
		"too many items":  pack(slices.Repeat([]api.ItemWrite{{Index: 1, Data: []byte("x")}}, 4097)),
	} {
		if r := h.do("PUT", "/v1/datasets/dec/batch", body); r.status < 400 || r.status >= 500 {
			t.Errorf("%s: %d %s; want a 4xx", name, r.status, r.body)
		}
	}
	// Elements that lack a field, or whose index is no int, are refused
	// whole: the attack round had them written as index 0 or as empty bytes.
	for name, body := range map[string][]byte{
		"no index":           pack([]map[string]any{{"index": 1, "data": []byte("x")}, {"data": []byte("zz")}}),
		"no data":            pack([]map[string]any{{"index": 1, "data": []byte("x")}, {"index": 2}}),
		"nil data":           pack([]map[string]any{{"index": 2, "data": nil}}),
		"a nil element":      pack([]any{map[string]any{"index": 1, "data": []byte("x")}, nil}),
		"a string index":     pack([]map[string]any{{"index": "2", "data": []byte("x")}}),
		"a float index":      pack([]map[string]any{{"index": 2.0, "data": []byte("x")}}),
		"an index past 2^63": pack([]map[string]any{{"index": uint64(1) << 63, "data": []byte("x")}}),
		"a string element":   pack([]any{"index"}),
		// Five bytes that declare four billion elements: the msgpack
		// library allocated them all (32 GiB) before reading one.
		"a count past the body": {0xdd, 0xff, 0xff, 0xff, 0xff},
		"a map past the body":   {0x91, 0xdf, 0xff, 0xff, 0xff, 0xff},
	} {
		r := h.do("PUT", "/v1/datasets/dec/batch", body)
		if r.status != 400 {
			t.Errorf("%s: %d %s; want 400", name, r.status, r.body)
		}
		if name == "an index past 2^63" && !bytes.Contains(r.body, []byte("9223372036854775808 is out of range")) {
			t.Errorf("%s: %s; want the index as sent", name, r.body)
		}
	}
	if n := written(); n != 0 {
		t.Fatalf("refused batches wrote %d items", n)
	}
	if r := h.do("PUT", "/v1/datasets/dec/batch", pack([]api.ItemWrite{{Index: 1, Data: []byte("x")}}), "Authorization", "Bearer wrong"); r.status != 401 {
		t.Fatalf("wrong token: %d", r.status)
	}
	batch := []api.ItemWrite{{Index: 3, Data: []byte("three")}, {Index: 5, Data: []byte("five")}}
	var got []api.WriteResult
	r := h.do("PUT", "/v1/datasets/dec/batch", pack(batch))
	if err := json.Unmarshal(r.body, &got); r.status != 200 || err != nil || len(got) != 2 ||
		got[0] != (api.WriteResult{Index: 3, Status: 201, Bytes: 5, Created: true}) || got[1] != (api.WriteResult{Index: 5, Status: 201, Bytes: 4, Created: true}) {
		t.Fatalf("a batch: %d %s", r.status, r.body)
	}
	for _, it := range batch {
		if r := h.do("GET", fmt.Sprintf("/v1/datasets/dec/index/%d", it.Index), nil); r.status != 200 || !bytes.Equal(r.body, it.Data) {
			t.Fatalf("item %d reads %d %q", it.Index, r.status, r.body)
		}
	}
	batch = append(batch, api.ItemWrite{Index: 6, Data: []byte("six")})
	batch[1].Data = []byte("FIVE")
	r = h.do("PUT", "/v1/datasets/dec/batch", pack(batch))
	if err := json.Unmarshal(r.body, &got); r.status != 200 || err != nil || len(got) != 3 ||
		got[0].Status != 200 || got[0].Created || got[1].Status != 409 || got[1].Error == "" || got[2].Status != 201 {
		t.Fatalf("again, one changed, one new: %d %s", r.status, r.body)
	}
	if r := h.do("GET", "/v1/datasets/dec/index/5", nil); string(r.body) != "five" {
		t.Fatalf("the first bytes of item 5 did not stay: %q", r.body)
	}
	if n := written(); n != 3 {
		t.Fatalf("written %d, want 3", n)
	}
}

// An owner from before batch writes answers PUT …/batch 405: its items are
// relayed to it one by one (PUT …/index/{i}), each with its own status,
// and the others in the batch are not touched.
func TestRelayedBatchToAnOlderOwner(t *testing.T) {
	var mu sync.Mutex
	got := map[string][]byte{}
	owner := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasSuffix(r.URL.Path, "/batch") {
			http.Error(w, `{"error":"method not allowed"}`, http.StatusMethodNotAllowed)
			return
		}
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if r.Method != "PUT" || r.Header.Get("Authorization") != "Bearer sekrit" {
			http.Error(w, "want an authorized PUT", http.StatusBadRequest)
			return
		}
		if string(b) == "conflicting" {
			http.Error(w, `{"error":"written with other bytes"}`, http.StatusConflict)
			return
		}
		got[r.URL.Path] = b
		w.WriteHeader(http.StatusCreated)
	}))
	defer owner.Close()
	peers := relay.New("self", "")
	defer peers.Close()
	r := derivedRoutes{peers: peers}
	items := []api.ItemWrite{{Index: 1, Data: []byte("one")}, {Index: 2, Data: []byte("not relayed")},
		{Index: 3, Data: []byte("conflicting")}}
	results := make([]api.WriteResult, len(items))
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod("PUT")
	req.Header.Set("Authorization", "Bearer sekrit")
	r.relayBatch(req, strings.TrimPrefix(owner.URL, "http://"), "/v1/datasets/dec/batch", items, []int{0, 2}, results)
	if results[0].Status != 201 || !results[0].Created || results[1] != (api.WriteResult{}) ||
		results[2].Status != 409 || results[2].Error != "written with other bytes" {
		t.Fatalf("results %+v", results)
	}
	if len(got) != 1 || string(got["/v1/datasets/dec/index/1"]) != "one" {
		t.Fatalf("the owner got %q", got)
	}
}

// A write's body is read into a recycled buffer (route.recycle), and what
// the node stores is a copy: scribbling over the buffers after the writes
// changes no item, one item or a batch of them.
func TestWriteBodiesRecycled(t *testing.T) {
	var s *Server
	dir, files := writeDataset(t, 64, 100)
	h := startOn(t, dir, files, 64<<20, "minio", "sekrit", func(srv *Server, _ *node.Node) { s = srv })
	if r := h.do("PUT", "/v1/datasets/dec", []byte(`{"derived_from":"ds","stage":"recycled"}`)); r.status != 201 {
		t.Fatalf("derive: %d %s", r.status, r.body)
	}
	item := func(i int) []byte { return bytes.Repeat([]byte{byte(i)}, 100<<10) }
	read := map[string]bool{}
	next := 0
	// sync.Pool may drop a buffer it is given (on purpose under -race):
	// each round writes a batch and an item, then takes what the pool holds
	// (which orders the server's writes before these reads for -race).
	for round := 0; round < 12 && !(read["a batch"] && read["an item"]); round++ {
		batch := []api.ItemWrite{{Index: next, Data: item(next)}, {Index: next + 1, Data: item(next + 1)}, {Index: next + 2, Data: item(next + 2)}}
		body, err := msgpack.Marshal(batch)
		if err != nil {
			t.Fatal(err)
		}
		if r := h.do("PUT", "/v1/datasets/dec/batch", body); r.status != 200 {
			t.Fatalf("a batch: %d %s", r.status, r.body)
		}
		if r := h.do("PUT", fmt.Sprintf("/v1/datasets/dec/index/%d", next+3), item(next+3)); r.status != 201 {
			t.Fatalf("an item: %d %s", r.status, r.body)
		}
		for name, sent := range map[string][]byte{"a batch": body, "an item": item(next + 3)} {
			for range 4 {
				pb := s.bodyBufs.Get(len(sent))
				read[name] = read[name] || bytes.Equal(pb.B, sent)
				clear(pb.B[:cap(pb.B)])
			}
		}
		next += 4
	}
	if !read["a batch"] || !read["an item"] {
		t.Fatalf("bodies read into a pooled buffer: %v", read)
	}
	for i := range next {
		if r := h.do("GET", fmt.Sprintf("/v1/datasets/dec/index/%d", i), nil); r.status != 200 || !bytes.Equal(r.body, item(i)) {
			t.Fatalf("item %d after its body's buffer was cleared: %d, %d bytes", i, r.status, len(r.body))
		}
	}
}
