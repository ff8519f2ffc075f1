package httpapi

import (
	"bytes"
	"encoding/json"
	"testing"
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
