package node

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
)

// Raft does not forward writes, so a follower relays catalog writes (and
// epoch pins) to the leader's HTTP API itself, then waits until it has
// applied what the leader did, so its caller reads its own write.

// followerGrace is how long a follower waits for a dataset or job it does not
// know yet, or for a leader: a registration acknowledged by the leader
// reaches followers a moment later, and a restarted follower hears from the
// leader a moment after it starts serving.
const followerGrace = time.Second

// catchUpWait bounds how long a follower waits for a dataset the leader
// already has: raft's replication backoff to a restarted follower reaches
// about ten seconds.
const catchUpWait = 15 * time.Second

type leaderLink struct {
	self, token string
	http        *fasthttp.Client
}

func newLeaderLink(self, token string) leaderLink {
	return leaderLink{self: self, token: token,
		http: &fasthttp.Client{Name: "stallfree-forward", ReadTimeout: 10 * time.Minute, MaxResponseBodySize: 64 << 20}}
}

// prepare addresses req to the leader's HTTP API at addr as this node's own
// request: authenticated, and marked relayed so it is never relayed again.
func (l leaderLink) prepare(req *fasthttp.Request, method, addr, path string) {
	req.Header.SetMethod(method)
	req.SetRequestURI("http://" + addr + path)
	req.Header.Set(api.HeaderForwarded, l.self)
	if l.token != "" {
		req.Header.Set("Authorization", "Bearer "+l.token)
	}
}

type relayedKey struct{}

// Relayed marks ctx as serving a request another node relayed here: it is
// never relayed again, so a request cannot bounce between nodes while
// leadership moves.
func Relayed(ctx context.Context) context.Context { return context.WithValue(ctx, relayedKey{}, true) }

func isRelayed(ctx context.Context) bool { v, _ := ctx.Value(relayedKey{}).(bool); return v }

// IsLeader reports whether this node is the raft leader.
func (n *Node) IsLeader() bool { return n.cat.IsLeader() }

// AppliedIndex is the raft index this node's catalog has applied; the
// leader sends it with every write (api.HeaderApplied).
func (n *Node) AppliedIndex() uint64 { return n.cat.AppliedIndex() }

// LeaderHTTP is the raft leader's HTTP address, or "" when unknown.
func (n *Node) LeaderHTTP() string {
	leader := n.cat.Leader()
	switch leader {
	case "":
		return ""
	case n.cfg.Name:
		return n.cfg.HTTPAdvert
	}
	addr, _ := n.peers.HTTPAddr(leader)
	return addr
}

// AwaitLeader returns the leader's HTTP address, waiting up to followerGrace
// for one; "" when there is none.
func (n *Node) AwaitLeader(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, followerGrace)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if addr := n.LeaderHTTP(); addr != "" {
			return addr
		}
		select {
		case <-ctx.Done():
			return ""
		case <-t.C:
		}
	}
}

// forward sends this node's write to the leader and decodes its JSON answer
// into out (when not nil), then waits until this node has applied it. A
// non-2xx answer comes back as *api.Error with the leader's status.
func (n *Node) forward(ctx context.Context, method, path string, body, out any, timeout time.Duration) (int, error) {
	if isRelayed(ctx) {
		// A leader that is not the leader by the time the request arrives: do
		// not bounce it around, let the client retry.
		return 0, &api.Error{Status: fasthttp.StatusServiceUnavailable, Message: "raft leadership is moving; retry"}
	}
	addr := n.LeaderHTTP()
	if addr == "" {
		return 0, &api.Error{Status: fasthttp.StatusServiceUnavailable,
			Message: "no raft leader (no quorum): catalog writes are unavailable"}
	}
	code, applied, err := n.leader.relay(addr, method, path, body, out, timeout)
	if err == nil && applied > 0 && !n.awaitApplied(ctx, applied) {
		// The write is done; only this node's next read may not show it yet.
		n.log.Warn("a relayed write has not reached this node's catalog yet", "path", path, "index", applied, "applied", n.cat.AppliedIndex())
	}
	return code, err
}

// relay sends a request to the leader's HTTP API at addr, with body as JSON
// when not nil, and decodes a 2xx answer into out (when not nil). applied is
// the raft index the leader reported for the write (0: none). A non-2xx
// answer is an *api.Error with the leader's status; no answer is a 503.
func (l leaderLink) relay(addr, method, path string, body, out any, timeout time.Duration) (code int, applied uint64, err error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	l.prepare(req, method, addr, path)
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return 0, 0, err
		}
		req.Header.SetContentType("application/json")
		req.SetBodyRaw(b)
	}
	if err := l.http.DoTimeout(req, resp, timeout); err != nil {
		return 0, 0, &api.Error{Status: fasthttp.StatusServiceUnavailable, Message: "forward to raft leader: " + err.Error()}
	}
	code = resp.StatusCode()
	if code >= 300 {
		e := &api.Error{Status: code}
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

// awaitApplied waits (briefly) until this node has applied index idx, and
// reports whether it has.
func (n *Node) awaitApplied(ctx context.Context, idx uint64) bool {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return n.cat.WaitFor(wctx, func() bool { return n.cat.AppliedIndex() >= idx })
}

// CountRelayedRead counts a read the leader answered for this follower.
func (n *Node) CountRelayedRead() { n.counters.relayedReads.Add(1) }

// leaderHas reports whether the raft leader answers 200 to GET path.
func (n *Node) leaderHas(ctx context.Context, path string) bool {
	addr := n.AwaitLeader(ctx)
	if addr == "" || n.cat.IsLeader() {
		return false
	}
	return n.leader.has(addr, path)
}

// has reports whether the API at addr answers 200 to GET path.
func (l leaderLink) has(addr, path string) bool {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	l.prepare(req, fasthttp.MethodGet, addr, path)
	return l.http.DoTimeout(req, resp, 5*time.Second) == nil && resp.StatusCode() == fasthttp.StatusOK
}
