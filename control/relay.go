package control

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/relay"
)

// maxLeaderAnswer bounds a relayed answer: a relayed read may carry a
// batch, so the API's largest.
const maxLeaderAnswer = 1 << 30

// writeTo sends this node's request to the leader's HTTP API at addr, with
// body as JSON when not nil, and decodes a 2xx answer into out (when not
// nil). applied is the raft index the leader reported for the write (0:
// none). A non-2xx answer is an *api.Error with the leader's status; no
// answer is a 503.
func writeTo(cl *relay.Client, addr, method, path string, body, out any, timeout time.Duration) (code int, applied uint64, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	resp, err := cl.JSON(ctx, method, addr, path, body, out, nil, maxLeaderAnswer)
	if e, ok := errors.AsType[*api.Error](err); ok {
		return e.Status, 0, e // passed on as the leader said it, Retry-After too
	}
	if resp == nil {
		return 0, 0, &api.Error{Status: http.StatusServiceUnavailable, Message: "forward to raft leader: " + err.Error()}
	}
	if err != nil {
		return resp.StatusCode, 0, fmt.Errorf("leader's answer: %w", err)
	}
	applied, _ = strconv.ParseUint(resp.Header.Get(api.HeaderApplied), 10, 64)
	return resp.StatusCode, applied, nil
}

// answersOK reports whether the API at addr answers 200 to GET path.
func answersOK(cl *relay.Client, addr, path string) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := cl.JSON(ctx, http.MethodGet, addr, path, nil, nil, nil, maxLeaderAnswer)
	return err == nil
}

// proxyTo passes in, a client's request, to the API at addr and copies the
// answer into out. The client's own credentials go with it.
func proxyTo(cl *relay.Client, addr string, in *fasthttp.Request, out *fasthttp.Response) error {
	// A read: bounded like a fill, so a hung leader cannot stall a loader long.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return cl.Forward(ctx, addr, string(in.URI().RequestURI()), in, out, nil, maxLeaderAnswer)
}
