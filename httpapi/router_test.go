package httpapi

import (
	"testing"

	"github.com/valyala/fasthttp"
)

// The table matches whole patterns in order: literals before captures of the
// same place, {name...} takes the rest raw, a path served under another
// method is a 405 and an unknown one a 404.
func TestRouterMatches(t *testing.T) {
	var served string
	h := func(name string) handler { return func(*fasthttp.RequestCtx, params) { served = name } }
	r := newRouter([]route{
		{method: get, pattern: "/v1/datasets/{dataset}", handle: h("get")},
		{method: put, pattern: "/v1/datasets/{dataset}", handle: h("put")},
		{method: post, pattern: "/v1/datasets/{dataset}/samples/batch", handle: h("samples")},
		{method: get, pattern: "/v1/datasets/{dataset}/samples/{sample}", handle: h("sample")},
		{method: get, pattern: "/v1/datasets/{dataset}/items/{key...}", handle: h("item")},
	})
	for _, c := range []struct {
		method, path, want string
		params             map[string]string
		allowed            bool
	}{
		{get, "/v1/datasets/ds", "get", map[string]string{"dataset": "ds"}, false},
		{put, "/v1/datasets/ds", "put", map[string]string{"dataset": "ds"}, false},
		{del, "/v1/datasets/ds", "", nil, true},
		{post, "/v1/datasets/ds/samples/batch", "samples", nil, false},
		{get, "/v1/datasets/ds/samples/batch", "sample", map[string]string{"sample": "batch"}, false},
		{post, "/v1/datasets/ds/samples/3", "", nil, true},
		{get, "/v1/datasets/ds/items/a/b%2Fc/d.jpg", "item", map[string]string{"dataset": "ds", "key": "a/b%2Fc/d.jpg"}, false},
		{get, "/v1/datasets/ds/items/", "item", map[string]string{"key": ""}, false},
		{get, "/v1/datasets", "", nil, false},
		{get, "/v1/datasets/ds/nope", "", nil, false},
		{get, "/v2/datasets/ds", "", nil, false},
	} {
		var segs [16]string
		path, seg := splitPath([]byte(c.path), segs[:0])
		rt, p, allowed := r.match(c.method, path, seg)
		served = ""
		if rt != nil {
			rt.handle(nil, p)
		}
		if served != c.want || allowed != c.allowed {
			t.Errorf("%s %s: served %q (allowed elsewhere %v), want %q (%v)", c.method, c.path, served, allowed, c.want, c.allowed)
			continue
		}
		for k, v := range c.params {
			if got := p.get(k); got != v {
				t.Errorf("%s %s: {%s} = %q, want %q", c.method, c.path, k, got, v)
			}
		}
	}
}

// Names of datasets and jobs reach handlers unescaped and checked.
func TestRouteNamesAreChecked(t *testing.T) {
	r := newRouter([]route{{method: get, pattern: "/v1/jobs/{job}/epochs/{epoch}", handle: func(*fasthttp.RequestCtx, params) {}}})
	for path, ok := range map[string]bool{
		"/v1/jobs/train%2D1/epochs/3": true, "/v1/jobs/..%2Fx/epochs/3": false, "/v1/jobs/%zz/epochs/3": false, "/v1/jobs/-x/epochs/3": false,
	} {
		var segs [16]string
		p, seg := splitPath([]byte(path), segs[:0])
		_, params, _ := r.match(get, p, seg)
		err := params.decodeNames()
		if (err == nil) != ok {
			t.Errorf("%s: %v", path, err)
		}
		if ok && (params.get("job") != "train-1" || params.get("epoch") != "3") {
			t.Errorf("%s: job %q epoch %q", path, params.get("job"), params.get("epoch"))
		}
	}
}

// Every line of the real table is distinct, and every pattern parses.
func TestRouteTableIsDistinct(t *testing.T) {
	h := start(t, 1, 10, 1<<20, "lru", "")
	seen := map[string]bool{}
	for _, rt := range newRouter(new(Server).routes(h.node)).routes {
		k := rt.method + " " + rt.pattern
		if seen[k] {
			t.Errorf("%s twice", k)
		}
		seen[k] = true
	}
}
