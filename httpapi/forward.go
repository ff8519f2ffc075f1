package httpapi

import (
	"context"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// forwardedHeader marks a request relayed by another node, so that it is
// never relayed again.
const forwardedHeader = "X-Stallfree-Forwarded"

// forwardIfFollower sends a catalog write to the raft leader's HTTP API and
// relays its answer (raft itself does not forward). It reports whether the
// request was handled here.
func (s *Server) forwardIfFollower(ctx *fasthttp.RequestCtx) bool {
	if s.node.Catalog().IsLeader() {
		return false
	}
	addr := s.node.LeaderHTTP()
	if addr == "" {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "no raft leader (no quorum): catalog writes are unavailable")
		return true
	}
	if len(ctx.Request.Header.Peek(forwardedHeader)) > 0 {
		// A leader that is not the leader by the time the request arrives: do
		// not bounce it around, let the client retry.
		writeError(ctx, fasthttp.StatusServiceUnavailable, "raft leadership is moving; retry")
		return true
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	// Registering a large dataset lists its source on the leader: allow minutes.
	if err := s.relay(ctx, addr, resp, 10*time.Minute); err != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, "forward to raft leader: "+err.Error())
		return true
	}
	s.awaitApplied(resp)
	resp.CopyTo(&ctx.Response)
	return true
}

// awaitApplied gives read-your-writes after a write the leader made: it
// waits (briefly) until this node has applied the index the leader reports.
func (s *Server) awaitApplied(resp *fasthttp.Response) {
	idx, err := strconv.ParseUint(string(resp.Header.Peek(appliedHeader)), 10, 64)
	if err != nil {
		return
	}
	cat := s.node.Catalog()
	wctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	cat.WaitFor(wctx, func() bool { return cat.AppliedIndex() >= idx })
	cancel()
}

// callLeader sends this node's own request (method, path) to the leader's
// HTTP API at addr, authenticated and marked as relayed.
func (s *Server) callLeader(addr, method, path string, resp *fasthttp.Response, timeout time.Duration) error {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod(method)
	req.SetRequestURI("http://" + addr + path)
	req.Header.Set(forwardedHeader, s.node.Name())
	if len(s.token) > 0 {
		req.Header.Set("Authorization", "Bearer "+string(s.token))
	}
	return s.forwarder.DoTimeout(req, resp, timeout)
}

// relayUnknown answers a read that names a dataset or job this follower does
// not know with the leader's answer. A follower restarted moments ago learns
// the commit index, and so applies even the log it holds on disk, only when
// the leader next replicates to it, which raft's backoff can delay by
// seconds; a 404 meanwhile would be wrong. It reports whether ctx was
// answered; when the leader cannot be asked, the caller answers from the
// local catalog.
func (s *Server) relayUnknown(ctx *fasthttp.RequestCtx) bool {
	if s.node.Catalog().IsLeader() || len(ctx.Request.Header.Peek(forwardedHeader)) > 0 {
		return false
	}
	addr := s.awaitLeader()
	if addr == "" {
		return false
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	// A read: bounded like a fill, so a hung leader cannot stall a loader long.
	if err := s.relay(ctx, addr, resp, 30*time.Second); err != nil {
		s.log.Debug("relay to leader", "err", err)
		return false
	}
	resp.CopyTo(&ctx.Response)
	return true
}

// awaitLeader returns the leader's HTTP address, waiting up to followerGrace
// for one: a restarted follower hears from the leader a moment after it
// starts serving. "" when there is none.
func (s *Server) awaitLeader() string {
	addr := s.node.LeaderHTTP()
	for deadline := time.Now().Add(followerGrace); addr == "" && time.Now().Before(deadline); addr = s.node.LeaderHTTP() {
		time.Sleep(20 * time.Millisecond)
	}
	return addr
}

// relay sends a copy of the request to the node serving HTTP at addr.
func (s *Server) relay(ctx *fasthttp.RequestCtx, addr string, resp *fasthttp.Response, timeout time.Duration) error {
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	ctx.Request.CopyTo(req)
	req.SetRequestURI("http://" + addr + string(ctx.URI().PathOriginal()))
	req.SetHost(addr)
	req.Header.Set(forwardedHeader, s.node.Name())
	return s.forwarder.DoTimeout(req, resp, timeout)
}

// appliedHeader carries the leader's applied raft index after a write.
const appliedHeader = "X-Stallfree-Index"

func (s *Server) markApplied(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.Set(appliedHeader, strconv.FormatUint(s.node.Catalog().AppliedIndex(), 10))
}
