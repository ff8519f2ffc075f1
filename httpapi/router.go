package httpapi

import (
	"strings"

	"github.com/valyala/fasthttp"
)

// handler serves one route; p holds what its pattern captured.
type handler func(ctx *fasthttp.RequestCtx, p params)

// A route is one line of the table (routes.go): a method and a path pattern,
// and the handler that serves them. A pattern's segments are literals,
// {name} (one segment, as sent: names of datasets and jobs arrive decoded
// and validated, see captured) or a last {name...} (the rest of the path,
// raw, for item keys that hold slashes).
type route struct {
	method  string
	pattern string
	handle  handler
	// open routes are served without the bearer token (probes, metrics).
	open bool
	// stream routes get the request body unread (the server streams bodies,
	// StreamRequestBody); every other route gets it read whole, up to limit
	// (nil: the server's MaxRequestBodySize).
	stream bool
	limit  func() int
	// recycle routes' handlers keep nothing of the body once they return
	// (they copy what they store and relay it before they answer): its
	// buffer is reused for the next such body instead of allocated fresh.
	recycle bool

	segs []string // pattern, cut at its slashes
	rest bool     // the last segment is {name...}
}

// maxParams bounds the segments a pattern captures.
const maxParams = 6

// params are the segments a request's path gave its route's captures.
type params struct {
	r    *route
	vals [maxParams]string
}

// get is the value of capture name ("" when the pattern has none).
func (p params) get(name string) string {
	x := 0
	for _, s := range p.r.segs {
		if !isCapture(s) {
			continue
		}
		if captureName(s) == name {
			return p.vals[x]
		}
		x++
	}
	return ""
}

func isCapture(seg string) bool { return len(seg) > 2 && seg[0] == '{' && seg[len(seg)-1] == '}' }

func captureName(seg string) string { return strings.TrimSuffix(seg[1:len(seg)-1], "...") }

// router matches requests against the table, in its order.
type router struct{ routes []route }

func newRouter(routes []route) *router {
	r := &router{routes: routes}
	for i := range r.routes {
		rt := &r.routes[i]
		rt.segs = strings.Split(strings.TrimPrefix(rt.pattern, "/"), "/")
		captures := 0
		for j, s := range rt.segs {
			if !isCapture(s) {
				continue
			}
			captures++
			if strings.HasSuffix(s, "...}") {
				if j != len(rt.segs)-1 {
					panic("httpapi: " + rt.pattern + ": {name...} must end the pattern")
				}
				rt.rest = true
			}
		}
		if captures > maxParams {
			panic("httpapi: " + rt.pattern + ": too many captures")
		}
	}
	return r
}

// match finds the route for method and the path cut into seg (splitPath),
// path being what seg were cut from. When the path matches routes but none
// for this method, allowed is true (405); when it matches none, both are
// zero (404).
func (r *router) match(method, path string, seg []string) (rt *route, p params, allowed bool) {
	for i := range r.routes {
		c := &r.routes[i]
		if !c.matches(path, seg, &p) {
			continue
		}
		if c.method != method {
			allowed = true
			continue
		}
		p.r = c
		return c, p, false
	}
	return nil, params{}, allowed
}

// matches reports whether seg fit the route's pattern, filling p.vals.
func (c *route) matches(path string, seg []string, p *params) bool {
	if len(seg) != len(c.segs) && !(c.rest && len(seg) >= len(c.segs)) {
		return false
	}
	x := 0
	for j, s := range c.segs {
		if !isCapture(s) {
			if seg[j] != s {
				return false
			}
			continue
		}
		if c.rest && j == len(c.segs)-1 {
			p.vals[x] = lastSegments(path, seg[j:])
		} else {
			p.vals[x] = seg[j]
		}
		x++
	}
	return true
}

// decodeNames unescapes and checks the captures that name a dataset, a job
// or a group: they appear in paths and metrics, so they keep to a safe alphabet.
func (p *params) decodeNames() error {
	x := 0
	for _, s := range p.r.segs {
		if !isCapture(s) {
			continue
		}
		if name := captureName(s); name == "dataset" || name == "job" || name == "group" {
			v, err := decodeSegment(name, p.vals[x])
			if err != nil {
				return err
			}
			p.vals[x] = v
		}
		x++
	}
	return nil
}
