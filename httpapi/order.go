package httpapi

import (
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"
)

// jobOrder serves
//
//	GET  /v1/jobs/{job}/epochs/{e}/ranks/{r}             {"indices": [...]}
//	     ...?from_generation=G&position=P                the rest of an interrupted epoch
//	GET  /v1/jobs/{job}/epochs/{e}/ranks/{r}/batches/{b} msgpack items
//	POST /v1/jobs/{job}/epochs/{e}/pin                   (leader: pin the epoch's member set)
func (s *Server) jobOrder(ctx *fasthttp.RequestCtx, method, job string, seg []string) {
	if len(seg) < 3 || seg[0] != "epochs" {
		writeError(ctx, fasthttp.StatusNotFound, "no such route")
		return
	}
	epoch, err := strconv.ParseUint(seg[1], 10, 64)
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("epoch %q: want a non-negative integer", seg[1]))
		return
	}
	rctx, cancel := reqContext(ctx, 2*time.Minute)
	defer cancel()
	if len(seg) == 3 && seg[2] == "pin" && method == fasthttp.MethodPost {
		if err := s.node.PinEpoch(rctx, job, epoch); err != nil {
			fail(ctx, err)
			return
		}
		s.markApplied(ctx)
		ctx.SetStatusCode(fasthttp.StatusNoContent)
		return
	}
	if seg[2] != "ranks" || len(seg) < 4 || method != fasthttp.MethodGet {
		writeError(ctx, fasthttp.StatusNotFound, "no such route")
		return
	}
	if !s.node.HasJob(job) && s.relayUnknown(ctx) {
		return
	}
	rank, err := strconv.Atoi(seg[3])
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("rank %q: want a non-negative integer", seg[3]))
		return
	}
	switch {
	case len(seg) == 4 && ctx.QueryArgs().Has("from_generation"):
		from, err1 := strconv.ParseUint(string(ctx.QueryArgs().Peek("from_generation")), 10, 64)
		position, err2 := strconv.Atoi(string(ctx.QueryArgs().Peek("position")))
		if err1 != nil || err2 != nil || position < 0 {
			writeError(ctx, fasthttp.StatusBadRequest, "from_generation and position: want non-negative integers")
			return
		}
		o, err := s.node.ResumedOrder(rctx, job, epoch, rank, from, position)
		if err != nil {
			fail(ctx, err)
			return
		}
		writeJSON(ctx, 200, o)
	case len(seg) == 4:
		o, err := s.node.RankOrder(rctx, job, epoch, rank)
		if err != nil {
			fail(ctx, err)
			return
		}
		writeJSON(ctx, 200, o)
	case len(seg) == 6 && seg[4] == "batches":
		b, err := strconv.Atoi(seg[5])
		if err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("batch %q: want a non-negative integer", seg[5]))
			return
		}
		items, spans, err := s.node.JobBatch(rctx, job, epoch, rank, b)
		if err != nil {
			fail(ctx, err)
			return
		}
		if spans != nil {
			s.writeSamples(ctx, items, spans, false)
			return
		}
		s.writeBatch(ctx, items)
	default:
		writeError(ctx, fasthttp.StatusNotFound, "no such route")
	}
}
