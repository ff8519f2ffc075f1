package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/node"
)

// jobOrder serves
//
//	GET  /v1/jobs/{job}/epochs/{e}/ranks/{r}             {"indices": [...]}
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
	if len(seg) == 3 && seg[2] == "pin" && method == fasthttp.MethodPost {
		if s.forwardIfFollower(ctx) {
			return
		}
		if err := s.node.PinEpoch(job, epoch); err != nil {
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
	if _, ok := s.node.Catalog().Job(job); !ok && s.relayUnknown(ctx) {
		return
	}
	ep, err := s.plan(job, epoch)
	if err != nil {
		fail(ctx, err)
		return
	}
	rank, err := strconv.Atoi(seg[3])
	if err != nil || rank < 0 || rank >= len(ep.Ranks) {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("rank %q: want an integer in [0,%d)", seg[3], len(ep.Ranks)))
		return
	}
	switch {
	case len(seg) == 4:
		writeJSON(ctx, 200, map[string]any{"indices": ep.Ranks[rank], "batches": ep.Batches(), "batch_size": ep.BatchSize,
			"remote": ep.Remote[rank], "epoch": epoch})
	case len(seg) == 6 && seg[4] == "batches":
		b, err := strconv.Atoi(seg[5])
		if err != nil || b < 0 || b >= ep.Batches() {
			writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("batch %q: want an integer in [0,%d)", seg[5], ep.Batches()))
			return
		}
		s.serveJobBatch(ctx, ep, rank, b)
	default:
		writeError(ctx, fasthttp.StatusNotFound, "no such route")
	}
}

// plan returns the epoch plan; on a follower whose epoch is not pinned yet it
// asks the leader to pin it and waits until the pin has reached this node.
func (s *Server) plan(job string, epoch uint64) (*node.EpochPlan, error) {
	s.lookupJob(job) // a job just registered elsewhere may still be on its way here
	ep, err := s.node.Plan(job, epoch)
	if !errors.Is(err, node.ErrNeedPin) {
		return ep, err
	}
	addr := s.node.LeaderHTTP()
	if addr == "" {
		return nil, fmt.Errorf("%w: pinning epoch %d of %s", errNoLeader, epoch, job)
	}
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	path := fmt.Sprintf("/v1/jobs/%s/epochs/%d/pin", url.PathEscape(job), epoch)
	if err := s.callLeader(addr, fasthttp.MethodPost, path, resp, 30*time.Second); err != nil {
		return nil, fmt.Errorf("%w: pinning epoch: %w", errNoLeader, err)
	}
	if resp.StatusCode() != fasthttp.StatusNoContent {
		return nil, fmt.Errorf("%w: leader answered %d to pin: %s", errNoLeader, resp.StatusCode(), resp.Body())
	}
	s.awaitApplied(resp)
	return s.node.Plan(job, epoch)
}

func (s *Server) serveJobBatch(ctx *fasthttp.RequestCtx, ep *node.EpochPlan, rank, b int) {
	batch := ep.Batch(rank, b)
	idx := make([]int, len(batch))
	for j, i := range batch {
		idx[j] = int(i)
	}
	rctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	items, err := s.node.GetManyFor(rctx, ep.Data, idx, ep.Job.Name)
	if err != nil {
		fail(ctx, err)
		return
	}
	s.node.RecordJobItems(ep.Job.Name, rank, items)
	s.writeBatch(ctx, items)
}
