package control

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
)

// relayClient is the product's one HTTP client to another node's API: writes
// relayed to the leader, the leader's word on a dataset, and reads relayed
// to it. Every request it sends is this node's own (authenticated with the
// API token) and marked relayed (api.HeaderForwarded), so the receiver never
// relays it again.
type relayClient struct {
	self, token string
	http        *fasthttp.Client
}

func newRelayClient(self, token string) *relayClient {
	// Each call bounds itself (DoTimeout); ReadTimeout only backs that up.
	// A relayed read may carry a batch: the body limit is the API's largest.
	return &relayClient{self: self, token: token,
		http: &fasthttp.Client{Name: "stallfree-relay", ReadTimeout: 10 * time.Minute, MaxResponseBodySize: 1 << 30}}
}

// prepare addresses req to the API at addr as this node's own request.
func (r *relayClient) prepare(req *fasthttp.Request, method, addr, path string) {
	req.Header.SetMethod(method)
	req.SetRequestURI("http://" + addr + path)
	req.Header.Set(api.HeaderForwarded, r.self)
	if r.token != "" {
		req.Header.Set("Authorization", "Bearer "+r.token)
	}
}

// write sends a request to the leader's HTTP API at addr, with body as JSON
// when not nil, and decodes a 2xx answer into out (when not nil). applied is
// the raft index the leader reported for the write (0: none). A non-2xx
// answer is an *api.Error with the leader's status; no answer is a 503.
func (r *relayClient) write(addr, method, path string, body, out any, timeout time.Duration) (code int, applied uint64, err error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	r.prepare(req, method, addr, path)
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, 0, err
		}
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(b)
	}
	if err := r.http.DoTimeout(req, resp, timeout); err != nil {
		return 0, 0, &api.Error{Status: fasthttp.StatusServiceUnavailable, Message: "forward to raft leader: " + err.Error()}
	}
	code = resp.StatusCode()
	if code >= 300 {
		e := &api.Error{Status: code, Retry: len(resp.Header.Peek("Retry-After")) > 0} // passed on as the leader said it
		if json.Unmarshal(resp.Body(), e) != nil || e.Message == "" {
			e.Message = string(resp.Body())
		}
		return code, 0, e
	}
	if out != nil {
		if err := json.Unmarshal(resp.Body(), out); err != nil {
			return code, 0, fmt.Errorf("leader's answer: %w", err)
		}
	}
	applied, _ = strconv.ParseUint(string(resp.Header.Peek(api.HeaderApplied)), 10, 64)
	return code, applied, nil
}

// has reports whether the API at addr answers 200 to GET path.
func (r *relayClient) has(addr, path string) bool {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	r.prepare(req, fasthttp.MethodGet, addr, path)
	return r.http.DoTimeout(req, resp, 5*time.Second) == nil && resp.StatusCode() == fasthttp.StatusOK
}

// proxy sends a copy of in, a client's request, to the API at addr and
// copies the answer into out. The client's own credentials go with it.
func (r *relayClient) proxy(addr string, in *fasthttp.Request, out *fasthttp.Response) error {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	in.CopyTo(req)
	req.SetRequestURI("http://" + addr + string(in.URI().PathOriginal()))
	req.SetHost(addr)
	req.Header.Set(api.HeaderForwarded, r.self)
	// A read: bounded like a fill, so a hung leader cannot stall a loader long.
	if err := r.http.DoTimeout(req, resp, 30*time.Second); err != nil {
		return err
	}
	resp.CopyTo(out)
	return nil
}
