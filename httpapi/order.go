package httpapi

import (
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// orderRoutes serve a job's epochs:
//
//	GET  /v1/jobs/{job}/epochs/{e}/ranks/{r}             {"indices": [...]}
//	     ...?from_generation=G&position=P                the rest of an interrupted epoch
//	GET  /v1/jobs/{job}/epochs/{e}/ranks/{r}/batches/{b} msgpack items
//	POST /v1/jobs/{job}/epochs/{e}/pin                   (leader: pin the epoch's member set)
type orderRoutes struct {
	c Jobs
	b Batches
}

// epochOf parses the route's epoch, answering a bad one.
func epochOf(ctx *fasthttp.RequestCtx, p params) (uint64, bool) {
	raw := p.get("epoch")
	epoch, err := strconv.ParseUint(raw, 10, 64)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("epoch %q: want a non-negative integer", raw))
		return 0, false
	}
	return epoch, true
}

// rankOf parses the route's epoch and rank, first relaying a read of a job
// this follower does not know yet to the leader; ok is false when ctx has
// been answered.
func (r orderRoutes) rankOf(ctx *fasthttp.RequestCtx, p params) (epoch uint64, rank int, ok bool) {
	if epoch, ok = epochOf(ctx, p); !ok {
		return 0, 0, false
	}
	if !r.c.HasJob(p.get("job")) && relayUnknown(ctx, r.c) {
		return 0, 0, false
	}
	raw := p.get("rank")
	rank, err := strconv.Atoi(raw)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("rank %q: want a non-negative integer", raw))
		return 0, 0, false
	}
	return epoch, rank, true
}

func (r orderRoutes) pin(ctx *fasthttp.RequestCtx, p params) {
	epoch, ok := epochOf(ctx, p)
	if !ok {
		return
	}
	rctx, cancel := reqContext(ctx, 2*time.Minute)
	defer cancel()
	if err := r.c.PinEpoch(rctx, p.get("job"), epoch); err != nil {
		fail(ctx, err)
		return
	}
	markApplied(ctx, r.c)
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

func (r orderRoutes) order(ctx *fasthttp.RequestCtx, p params) {
	epoch, rank, ok := r.rankOf(ctx, p)
	if !ok {
		return
	}
	job := p.get("job")
	rctx, cancel := reqContext(ctx, 2*time.Minute)
	defer cancel()
	if q := ctx.QueryArgs(); q.Has("from_generation") {
		from, err1 := strconv.ParseUint(string(q.Peek("from_generation")), 10, 64)
		position, err2 := strconv.Atoi(string(q.Peek("position")))
		if err1 != nil || err2 != nil || position < 0 {
			writeError(ctx, fasthttp.StatusBadRequest, "from_generation and position: want non-negative integers")
			return
		}
		o, err := r.c.ResumedOrder(rctx, job, epoch, rank, from, position)
		if err != nil {
			fail(ctx, err)
			return
		}
		writeJSON(ctx, 200, o)
		return
	}
	o, err := r.c.RankOrder(rctx, job, epoch, rank)
	if err != nil {
		fail(ctx, err)
		return
	}
	writeJSON(ctx, 200, o)
}

func (r orderRoutes) batch(ctx *fasthttp.RequestCtx, p params) {
	epoch, rank, ok := r.rankOf(ctx, p)
	if !ok {
		return
	}
	raw := p.get("batch")
	b, err := strconv.Atoi(raw)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("batch %q: want a non-negative integer", raw))
		return
	}
	rctx, cancel := reqContext(ctx, 2*time.Minute)
	defer cancel()
	items, spans, err := r.b.JobBatch(rctx, p.get("job"), epoch, rank, b)
	if err != nil {
		fail(ctx, err)
		return
	}
	if spans != nil {
		writeSamples(ctx, r.b, items, spans, false)
		return
	}
	writeBatch(ctx, r.b, items)
}
