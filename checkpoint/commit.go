package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/relay"
)

// Commit commits step once every listed part has two copies, and answers a
// *MissingError at once naming those that do not. It runs on the raft
// leader; a follower relays it there (relayed: this request was relayed
// here already, so it is not relayed again) and waits until its own catalog
// shows the commit.
func (s *Service) Commit(ctx context.Context, name string, step uint64, req api.CommitCheckpoint, relayed bool) (api.CheckpointStep, error) {
	if err := CheckName("checkpoint", name); err != nil {
		return api.CheckpointStep{}, err
	}
	if len(req.Parts) == 0 {
		return api.CheckpointStep{}, fmt.Errorf(`%w: a commit needs {"parts": ["0", ...]}`, ErrBadRequest)
	}
	seen := map[string]bool{}
	for _, p := range req.Parts {
		if err := CheckName("part", p); err != nil {
			return api.CheckpointStep{}, err
		}
		if seen[p] {
			return api.CheckpointStep{}, fmt.Errorf("%w: part %q listed twice", ErrBadRequest, p)
		}
		seen[p] = true
	}
	if len(req.Meta) > 0 && !json.Valid(req.Meta) {
		return api.CheckpointStep{}, fmt.Errorf("%w: meta is not JSON", ErrBadRequest)
	}
	if !s.cat.IsLeader() {
		return s.relayCommit(ctx, name, step, req, relayed)
	}
	held := s.gather(ctx, name, step)
	parts := make([]catalog.CheckpointPart, 0, len(req.Parts))
	var missing []string
	for _, p := range req.Parts {
		cp, ok := twoCopies(held[p])
		if !ok {
			missing = append(missing, p)
			continue
		}
		cp.Name = p
		parts = append(parts, cp)
	}
	if len(missing) > 0 {
		return api.CheckpointStep{}, &MissingError{Parts: missing}
	}
	st, err := s.cat.CommitCheckpoint(name, step, parts, string(req.Meta), s.cfg.Keep)
	if err != nil {
		return api.CheckpointStep{}, err
	}
	s.log.Info("checkpoint committed", "name", name, "step", step, "parts", len(parts), "bytes", st.Bytes())
	return s.stepInfo(st, s.live()), nil
}

// copyOf is one node's copy of a part.
type copyOf struct {
	node string
	HeldPart
}

// twoCopies picks the version of a part (size and sum) most nodes hold and
// reports whether at least two do.
func twoCopies(copies []copyOf) (catalog.CheckpointPart, bool) {
	by := map[string][]string{}
	size := map[string]int64{}
	for _, c := range copies {
		by[c.Sum] = append(by[c.Sum], c.node)
		size[c.Sum] = c.Bytes
	}
	var best catalog.CheckpointPart
	for sum, nodes := range by {
		if len(nodes) > len(best.Holders) {
			slices.Sort(nodes)
			best = catalog.CheckpointPart{Size: size[sum], Sum: sum, Holders: nodes}
		}
	}
	return best, len(best.Holders) >= 2
}

// gather asks every live member which parts of step it holds, for a
// commit: each keeps what it listed until the commit reaches its catalog
// (memory.store), so the bytes counted are the bytes committed.
func (s *Service) gather(ctx context.Context, name string, step uint64) map[string][]copyOf {
	var (
		mu  sync.Mutex
		out = map[string][]copyOf{}
		wg  sync.WaitGroup
	)
	add := func(node string, held []HeldPart) {
		mu.Lock()
		defer mu.Unlock()
		for _, h := range held {
			out[h.Part] = append(out[h.Part], copyOf{node: node, HeldPart: h})
		}
	}
	for _, m := range s.members.Members() {
		if m == s.cfg.Self {
			add(m, s.Held(name, step, true))
			continue
		}
		addr, ok := s.members.MemberHTTP(m)
		if !ok {
			continue
		}
		wg.Go(func() {
			var held []HeldPart
			if err := s.doJSON(ctx, http.MethodGet, addr, internalPath(name, step, "?commit=1"), &held); err != nil {
				s.log.Debug("checkpoint: asking a member what it holds", "member", m, "err", err)
				return
			}
			add(m, held)
		})
	}
	wg.Wait()
	return out
}

// Held lists the parts of a step this node holds (never nil). forCommit
// marks the listing as a commit's count (memory.step).
func (s *Service) Held(name string, step uint64, forCommit bool) []HeldPart {
	held := s.mem.step(name, step, forCommit)
	slices.SortFunc(held, func(a, b HeldPart) int { return cmpStr(a.Part, b.Part) })
	return held
}

func cmpStr(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Uploads lists the parts of a step uploaded so far, cluster-wide, with
// the copies each has: rank 0 of a job waits on it for the other ranks.
func (s *Service) Uploads(ctx context.Context, name string, step uint64) (api.CheckpointUpload, error) {
	if err := CheckName("checkpoint", name); err != nil {
		return api.CheckpointUpload{}, err
	}
	out := api.CheckpointUpload{Step: step, Parts: []api.UploadedPart{}}
	ck, _ := s.cat.Checkpoint(name)
	if st, ok := ck.Step(step); ok {
		out.Committed = true
		live := s.live()
		for _, p := range st.Parts {
			out.Parts = append(out.Parts, api.UploadedPart{Part: p.Name, Bytes: p.Size, Replicas: liveCount(p.Holders, live), Checksum: AlgoOf(p.Sum)})
		}
		return out, nil
	}
	held := s.gather(ctx, name, step)
	for part, copies := range held {
		best, _ := twoCopies(copies)
		out.Parts = append(out.Parts, api.UploadedPart{Part: part, Bytes: best.Size, Replicas: len(best.Holders), Checksum: AlgoOf(best.Sum)})
	}
	slices.SortFunc(out.Parts, func(a, b api.UploadedPart) int { return cmpStr(a.Part, b.Part) })
	return out, nil
}

// Delete drops a checkpoint (every step) on every node. A name with no
// committed step has only uploads: every live member drops its own.
func (s *Service) Delete(ctx context.Context, name string, relayed bool) error {
	if err := CheckName("checkpoint", name); err != nil {
		return err
	}
	if _, committed := s.cat.Checkpoint(name); !committed {
		return s.dropUploads(ctx, name)
	}
	if !s.cat.IsLeader() {
		if err := s.relay(ctx, http.MethodDelete, "/v1/checkpoints/"+name, nil, nil, relayed); err != nil {
			return err
		}
		s.awaitLocal(ctx, func() bool { _, ok := s.cat.Checkpoint(name); return !ok })
		return nil
	}
	return s.cat.DeleteCheckpoint(name)
}

func (s *Service) relayCommit(ctx context.Context, name string, step uint64, req api.CommitCheckpoint, relayed bool) (api.CheckpointStep, error) {
	var out api.CheckpointStep
	path := "/v1/checkpoints/" + name + "/steps/" + strconv.FormatUint(step, 10) + "/commit"
	if err := s.relay(ctx, http.MethodPost, path, req, &out, relayed); err != nil {
		return out, err
	}
	s.awaitLocal(ctx, func() bool { ck, _ := s.cat.Checkpoint(name); _, ok := ck.Step(step); return ok })
	return out, nil
}

// awaitLocal waits briefly until this node's catalog shows a relayed
// write, so the client reads its own write here.
func (s *Service) awaitLocal(ctx context.Context, cond func() bool) {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	s.cat.WaitFor(wctx, cond)
}

// relay sends a catalog write to the raft leader's API.
func (s *Service) relay(ctx context.Context, method, path string, body, out any, relayed bool) error {
	if relayed {
		return &api.Error{Status: http.StatusServiceUnavailable, Message: "raft leadership is moving; retry", Retry: true}
	}
	addr := s.members.LeaderHTTP()
	if addr == "" {
		return &api.Error{Status: http.StatusServiceUnavailable, Message: "no raft leader (no quorum): checkpoint commits are unavailable", Retry: true}
	}
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return err
		}
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	resp, err := s.peers.Do(ctx, method, addr, path, bytes.NewReader(b), int64(len(b)), http.Header{"Content-Type": {"application/json"}})
	if err != nil {
		return &api.Error{Status: http.StatusServiceUnavailable, Message: "relay to raft leader: " + err.Error()}
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		var m api.MissingParts
		if json.Unmarshal(b, &m) == nil && len(m.Missing) > 0 {
			return &MissingError{Parts: m.Missing}
		}
		resp.Body = io.NopCloser(bytes.NewReader(b))
		return relay.AnswerError(resp)
	}
	if out == nil {
		return nil
	}
	b, err = io.ReadAll(io.LimitReader(resp.Body, leaderAnswerLimit+1))
	if err != nil {
		return &api.Error{Status: http.StatusServiceUnavailable, Message: "reading the raft leader's answer: " + err.Error()}
	}
	if len(b) > leaderAnswerLimit {
		return &api.Error{Status: http.StatusBadGateway, Message: fmt.Sprintf("the raft leader's answer is over %d bytes", leaderAnswerLimit)}
	}
	return json.Unmarshal(b, out)
}

// leaderAnswerLimit bounds what a relayed write's answer may take: a
// commit's body is at most 1 MiB (its part names and meta), and its answer
// repeats those names twice beside the meta, the second time with ~30 bytes
// each: about 7.5 MB at most, for 174,000 parts of three-letter names
// (TestTheLargestCommitAnswerFits); the bound leaves four times that. Without
// a bound, a member answering without end grew this node's heap for as long
// as it sent.
const leaderAnswerLimit = 32 << 20

// dropUploads has every live member drop the parts it holds of name; not
// found when none held any.
func (s *Service) dropUploads(ctx context.Context, name string) error {
	dropped := s.DropLocal(name)
	for _, m := range s.members.Members() {
		addr, ok := s.members.MemberHTTP(m)
		if m == s.cfg.Self || !ok {
			continue
		}
		var n int
		if err := s.doJSON(ctx, http.MethodDelete, addr, "/v1/internal/checkpoints/"+name, &n); err != nil {
			s.log.Warn("checkpoint: asking a member to drop uploads", "member", m, "err", err)
			continue
		}
		dropped += n
	}
	if dropped == 0 {
		return fmt.Errorf("%w: checkpoint %q", catalog.ErrNotFound, name)
	}
	return nil
}

// DropLocal drops this node's parts of name and returns how many.
func (s *Service) DropLocal(name string) int {
	return s.mem.drop(func(k partKey) bool { return k.name == name })
}

// doJSON sends a bodiless request to the node at addr and decodes its
// JSON answer into out.
func (s *Service) doJSON(ctx context.Context, method, addr, path string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := s.call(ctx, method, addr, path, http.StatusOK)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(out)
}

// call sends a bodiless request of this node's own to the node at addr and
// returns its answer when the status is want; any other status is its
// *api.Error. The caller closes the body.
func (s *Service) call(ctx context.Context, method, addr, path string, want int) (*http.Response, error) {
	resp, err := s.peers.Do(ctx, method, addr, path, nil, 0, nil)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != want {
		defer resp.Body.Close()
		return nil, answerError(resp)
	}
	return resp, nil
}
