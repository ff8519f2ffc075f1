package httpapi

import (
	"context"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/catalog"
)

func (s *Server) jobs(ctx *fasthttp.RequestCtx, method string, seg []string) {
	if len(seg) == 0 {
		if method != fasthttp.MethodGet {
			methodNotAllowed(ctx)
			return
		}
		out := s.node.Catalog().Jobs()
		if out == nil {
			out = []*catalog.Job{}
		}
		writeJSON(ctx, 200, out)
		return
	}
	name, err := decodeSegment("job", seg[0])
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if len(seg) > 1 {
		s.jobOrder(ctx, method, name, seg[1:])
		return
	}
	switch method {
	case fasthttp.MethodGet:
		if _, ok := s.node.Catalog().Job(name); !ok && s.relayUnknown(ctx) {
			return
		}
		j, ok := s.lookupJob(name)
		if !ok {
			writeError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("no job %q", name))
			return
		}
		writeJSON(ctx, 200, j)
	case fasthttp.MethodPut:
		var j catalog.Job
		if err := decodeStrict(ctx.PostBody(), &j); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, err.Error())
			return
		}
		if j.Name != "" && j.Name != name {
			writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("body names job %q, path %q", j.Name, name))
			return
		}
		j.Name, j.Version = name, 0
		if err := validJob(&j); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, err.Error())
			return
		}
		// The leader checks the dataset: this node may not have caught up.
		if s.forwardIfFollower(ctx) {
			return
		}
		if _, ok := s.lookupDataset(j.Dataset); !ok {
			writeError(ctx, fasthttp.StatusNotFound, fmt.Sprintf("no dataset %q", j.Dataset))
			return
		}
		got, err := s.node.Catalog().PutJob(j)
		if err != nil {
			fail(ctx, err)
			return
		}
		s.markApplied(ctx)
		writeJSON(ctx, 200, got)
	case fasthttp.MethodDelete:
		s.catalogDelete(ctx, func() error { return s.node.Catalog().DeleteJob(name) })
	default:
		methodNotAllowed(ctx)
	}
}

// lookupJob finds a job, giving a follower a moment to catch up.
func (s *Server) lookupJob(name string) (*catalog.Job, bool) {
	cat := s.node.Catalog()
	j, ok := cat.Job(name)
	if !ok && !cat.IsLeader() {
		wctx, cancel := context.WithTimeout(context.Background(), followerGrace)
		cat.WaitFor(wctx, func() bool { j, ok = cat.Job(name); return ok })
		cancel()
	}
	return j, ok
}

// MaxWorldSize bounds a job's ranks.
const MaxWorldSize = 65536

func validJob(j *catalog.Job) error {
	if err := validName("dataset", j.Dataset); err != nil {
		return err
	}
	if j.WorldSize < 1 || j.WorldSize > MaxWorldSize {
		return fmt.Errorf("world_size %d: want 1..%d", j.WorldSize, MaxWorldSize)
	}
	if j.BatchSize < 1 || j.BatchSize > 1<<20 {
		return fmt.Errorf("batch_size %d: want 1..%d", j.BatchSize, 1<<20)
	}
	if len(j.Ranks) != 0 && len(j.Ranks) != j.WorldSize {
		return fmt.Errorf("ranks lists %d nodes for world_size %d", len(j.Ranks), j.WorldSize)
	}
	return nil
}

func (s *Server) loaderWait(ctx *fasthttp.RequestCtx) {
	var req struct {
		Seconds float64 `json:"seconds"`
		Batches uint64  `json:"batches"`
		Job     string  `json:"job"`
		Rank    int     `json:"rank"`
	}
	if err := decodeStrict(ctx.PostBody(), &req); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if req.Seconds < 0 || req.Seconds > 1e6 {
		writeError(ctx, fasthttp.StatusBadRequest, "seconds out of range")
		return
	}
	s.node.ReportLoaderWait(time.Duration(req.Seconds*float64(time.Second)), req.Batches)
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}
