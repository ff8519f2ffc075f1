package httpapi

import (
	"context"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/control"
)

// relayUnknown answers a read that names a dataset or job this follower does
// not know with the leader's answer (control.Control.ReadFromLeader). It
// reports whether ctx was answered; when the leader cannot be asked, the
// caller answers from the local catalog. A request another node relayed here
// is never relayed again.
func relayUnknown(ctx *fasthttp.RequestCtx, r Relay) bool {
	if relayed(ctx) {
		return false
	}
	return r.ReadFromLeader(&ctx.Request, &ctx.Response)
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
		c = control.Relayed(c)
	}
	return context.WithTimeout(c, timeout)
}

// markApplied tells the node that relayed a write which raft index to wait
// for before it answers its client (read-your-writes).
func markApplied(ctx *fasthttp.RequestCtx, r Relay) {
	ctx.Response.Header.Set(api.HeaderApplied, strconv.FormatUint(r.AppliedIndex(), 10))
}
