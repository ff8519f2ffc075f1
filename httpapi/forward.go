package httpapi

import (
	"context"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/node"
)

// relayUnknown answers a read that names a dataset or job this follower does
// not know with the leader's answer. A follower restarted moments ago learns
// the commit index, and so applies even the log it holds on disk, only when
// the leader next replicates to it, which raft's backoff can delay by
// seconds; a 404 meanwhile would be wrong. It reports whether ctx was
// answered; when the leader cannot be asked, the caller answers from the
// local catalog.
func (s *Server) relayUnknown(ctx *fasthttp.RequestCtx) bool {
	if s.node.IsLeader() || relayed(ctx) {
		return false
	}
	addr := s.node.AwaitLeader(context.Background())
	if addr == "" {
		return false
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	ctx.Request.CopyTo(req)
	req.SetRequestURI("http://" + addr + string(ctx.URI().PathOriginal()))
	req.SetHost(addr)
	req.Header.Set(api.HeaderForwarded, s.node.Name())
	// A read: bounded like a fill, so a hung leader cannot stall a loader long.
	if err := s.relayer.DoTimeout(req, resp, 30*time.Second); err != nil {
		s.log.Debug("relay to leader", "err", err)
		return false
	}
	resp.CopyTo(&ctx.Response)
	s.node.CountRelayedRead()
	return true
}

// relayed reports whether another node relayed this request here.
func relayed(ctx *fasthttp.RequestCtx) bool {
	return len(ctx.Request.Header.Peek(api.HeaderForwarded)) > 0
}

// reqContext is the context a handler hands the node: fasthttp's RequestCtx
// is no request context (it ends only at server shutdown).
func reqContext(ctx *fasthttp.RequestCtx, timeout time.Duration) (context.Context, context.CancelFunc) {
	c := context.Background()
	if relayed(ctx) {
		c = node.Relayed(c)
	}
	return context.WithTimeout(c, timeout)
}

// markApplied tells the node that relayed a write which raft index to wait
// for before it answers its client (read-your-writes).
func (s *Server) markApplied(ctx *fasthttp.RequestCtx) {
	ctx.Response.Header.Set(api.HeaderApplied, strconv.FormatUint(s.node.AppliedIndex(), 10))
}
