package httpapi

import (
	"bytes"
	"net/http"
	"strings"
	"testing"
)

// Bodies by route: a path no route serves is answered 404 (or 405) whatever
// its body, which is drained after the answer, and the connection serves
// the next request; a matched route refuses a body over its limit with 413;
// a stream route (a checkpoint part) without the token is a 401 that
// closes the connection; the checkpoint routes are a 404 on a node that
// serves no checkpoints.
func TestBodiesByRoute(t *testing.T) {
	h := start(t, 4, 100, 1<<20, "lru", "tok")
	big := bytes.Repeat([]byte("x"), 2*MaxBodySize)
	if r := h.do("PUT", "/v1/nothing/here", big); r.status != 404 {
		t.Fatalf("an unknown path with a 2 MiB body: %d %s", r.status, r.body)
	}
	if r := h.do("POST", "/v1/datasets", big); r.status != 405 {
		t.Fatalf("a method the path does not serve, with a 2 MiB body: %d %s", r.status, r.body)
	}
	if r := h.do("POST", "/v1/datasets/ds/batch", big); r.status != 413 {
		t.Fatalf("a batch of 2 MiB: %d %s", r.status, r.body)
	}
	if r := h.do("GET", "/v1/datasets/ds", nil); r.status != 200 {
		t.Fatalf("after the refusals: %d %s", r.status, r.body)
	}
	// Within the small drain a refused body gets its 401; past it the
	// sender may see a reset instead (hostile_test.go).
	req, err := http.NewRequest("PUT", h.base+"/v1/checkpoints/job/steps/1/parts/0", bytes.NewReader(big[:32<<10]))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || !resp.Close {
		t.Fatalf("a part without the token: %d (connection closed: %v)", resp.StatusCode, resp.Close)
	}
	for _, c := range []struct{ method, path string }{
		{"GET", "/v1/checkpoints"},
		{"PUT", "/v1/checkpoints/job/steps/1/parts/0"},
		{"POST", "/v1/checkpoints/job/steps/1/commit"},
	} {
		if r := h.do(c.method, c.path, nil); r.status != 404 || !strings.Contains(string(r.body), "not served by this node") {
			t.Fatalf("%s %s without checkpoints: %d %s", c.method, c.path, r.status, r.body)
		}
	}
}
