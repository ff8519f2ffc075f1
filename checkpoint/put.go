package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/relay"
)

// PutRequest names a part being written.
type PutRequest struct {
	Name string
	Step uint64
	Part string
	Sum  string // X-Checksum the body must have (ParseChecksum)
	Size int64  // Content-Length; -1 when unknown (refused)
	// Replica marks the partner's copy, sent by the node the client wrote
	// to: stored here only, never passed on.
	Replica bool
	// Repair allows a replica into a committed step (re-replication), when
	// its sum is the committed one.
	Repair bool
}

// chunk is how much of a body is read, hashed and passed on at a time.
const chunk = 1 << 20

// Put stores a part on this node and, unless it is itself a replica, on
// this node's partner, streaming the body to both at once: each node holds
// the part once, in the mapping it is stored in. It returns nil only when
// both copies are held. A body that ends early, or whose sha256 differs
// from req.Sum, leaves nothing stored anywhere: the partner's request is cut
// off too, and a part is published only once complete and checked.
func (s *Service) Put(ctx context.Context, req PutRequest, body io.Reader) error {
	if err := CheckName("checkpoint", req.Name); err != nil {
		return err
	}
	if err := CheckName("part", req.Part); err != nil {
		return err
	}
	want, err := ParseChecksum(req.Sum)
	if err != nil {
		return err
	}
	req.Sum = want.String() // kept, compared and sent on in one spelling
	if req.Size < 0 {
		return fmt.Errorf("%w: a part's body needs a Content-Length", ErrLengthRequired)
	}
	ck, _ := s.cat.Checkpoint(req.Name)
	if st, ok := ck.Step(req.Step); ok {
		p, had := st.Part(req.Part)
		if !req.Repair || !had || p.Sum != req.Sum {
			return fmt.Errorf("%w: checkpoint %s step %d is committed (immutable)", catalog.ErrConflict, req.Name, req.Step)
		}
	}
	var partnerAddr string
	if !req.Replica {
		members := s.members.Members()
		partner, ok := Partner(members, s.cfg.Self)
		if !ok {
			return fmt.Errorf("%w: no partner for %s among %v: a checkpoint part needs two nodes", ErrUnavailable, s.cfg.Self, members)
		}
		if partnerAddr, ok = s.members.MemberHTTP(partner); !ok {
			return fmt.Errorf("%w: partner %s has no HTTP address", ErrUnavailable, partner)
		}
	}
	buf, err := s.mem.reserve(req.Size)
	if err != nil {
		return err
	}
	stored := false
	defer func() {
		if !stored {
			s.mem.free(buf)
		}
	}()

	var rc *replicaConn
	if partnerAddr != "" {
		rep := req
		rep.Replica = true
		if rc, err = s.dialReplica(ctx, partnerAddr, rep); err != nil {
			return err
		}
		defer rc.Close()
	}
	// Receiving, hashing and passing on overlap: the loop below only reads
	// into the part's memory and hands each span to a hasher and (for the
	// partner) a forwarder, which work on it while the next span arrives.
	// All three share the one buffer; nothing is copied in user space.
	type span struct{ lo, hi int64 }
	var (
		h           = want.New()
		hashes      = make(chan span, 256)
		hashDone    = make(chan struct{})
		forwards    chan span
		forwardDone = make(chan struct{})
		forwardErr  error // the forwarder's; read after forwardDone
		partnerGone atomic.Bool
	)
	go func() {
		defer close(hashDone)
		for sp := range hashes {
			h.Write(buf[sp.lo:sp.hi])
		}
	}()
	if rc != nil {
		forwards = make(chan span, 256)
		go func() {
			defer close(forwardDone)
			for sp := range forwards {
				if forwardErr != nil {
					continue
				}
				if _, err := rc.up.Write(buf[sp.lo:sp.hi]); err != nil {
					forwardErr = err
					partnerGone.Store(true)
				}
			}
		}()
	} else {
		close(forwardDone)
	}
	finish := func() {
		close(hashes)
		if forwards != nil {
			close(forwards)
		}
		<-hashDone
		<-forwardDone
	}
	// fail cuts the partner's copy off (it sees its body end early and keeps
	// nothing) and reports why this one failed.
	fail := func(err error) error {
		if rc != nil {
			rc.Close()
		}
		finish()
		return err
	}

	var off int64
	for off < req.Size {
		if partnerGone.Load() {
			finish()
			return rc.partnerError(forwardErr)
		}
		// A client that went away ends the loop even when its body reader
		// would not (one that answers 0, nil forever).
		if err := ctx.Err(); err != nil {
			return fail(fmt.Errorf("%w: part %s of step %d: %w", ErrUnavailable, req.Part, req.Step, err))
		}
		n, rerr := body.Read(buf[off:min(off+chunk, req.Size)])
		if n > 0 {
			sp := span{off, off + int64(n)}
			hashes <- sp
			if forwards != nil {
				forwards <- sp
			}
			off += int64(n)
		}
		if rerr != nil && off < req.Size {
			if rerr == io.EOF {
				rerr = io.ErrUnexpectedEOF
			}
			return fail(&cutError{got: off, want: req.Size, err: rerr})
		}
	}
	finish()
	if forwardErr != nil {
		return rc.partnerError(forwardErr)
	}
	if got := want.Of(h); got != want {
		if rc != nil {
			rc.Close() // the partner checks the sum too; either way it keeps nothing
		}
		return fmt.Errorf("%w: X-Checksum %s, but the body's %s is %s", ErrBadRequest, req.Sum, want.Algo, got.Value)
	}
	if rc != nil {
		if err := rc.answer(); err != nil {
			return err
		}
	}
	// The check above ran before the body; the step may have been committed
	// (or counted by a commit) since. store decides under the lock a
	// commit's count takes.
	if err := s.mem.store(partKey{req.Name, req.Step, req.Part}, buf, req.Sum, s.committedSum); err != nil {
		return err
	}
	stored = true
	return nil
}

// committedSum is the sum part k was committed with, when its step is
// committed in this node's catalog ("" when the step lacks the part).
func (s *Service) committedSum(k partKey) (string, bool) {
	ck, _ := s.cat.Checkpoint(k.name)
	st, ok := ck.Step(k.step)
	if !ok {
		return "", false
	}
	p, _ := st.Part(k.part)
	return p.Sum, true
}

// replicaConn is a PUT of a part's copy to the partner, written straight to
// the connection as the part arrives (relay.Upload): each span is one write
// from the part's memory. Closing it before the last byte is how a copy is
// cut off.
type replicaConn struct {
	up   *relay.Upload
	addr string
}

func (s *Service) dialReplica(ctx context.Context, addr string, req PutRequest) (*replicaConn, error) {
	up, err := s.peers.Upload(ctx, addr, internalPath(req.Name, req.Step, "/parts/"+req.Part), req.Size,
		http.Header{api.HeaderChecksum: {req.Sum}}, replicaIdle)
	if err != nil {
		return nil, fmt.Errorf("%w: partner copy to %s: %w", ErrUnavailable, addr, err)
	}
	return &replicaConn{up: up, addr: addr}, nil
}

// replicaIdle is how long a partner's copy may make no progress (a write,
// or its answer) before it is given up: the partner's own --idle-timeout
// default. The whole copy takes as long as the client's body does.
const replicaIdle = 30 * time.Second

// answer reads the partner's answer once the whole part is sent.
func (r *replicaConn) answer() error { return r.answerWithin(0) }

func (r *replicaConn) answerWithin(d time.Duration) error {
	err := r.up.Answer(http.StatusCreated, d)
	if e, ok := errors.AsType[*api.Error](err); ok {
		e.Message = "partner: " + e.Message
		return e
	}
	if err != nil {
		return fmt.Errorf("%w: partner copy to %s: %w", ErrUnavailable, r.addr, err)
	}
	return nil
}

// partnerError is why a write to the partner failed: its answer, when it
// sent one (a refusal), else the write's error.
func (r *replicaConn) partnerError(werr error) error {
	if e, ok := errors.AsType[*api.Error](r.answerWithin(time.Second)); ok {
		return e
	}
	return fmt.Errorf("%w: partner copy to %s: %w", ErrUnavailable, r.addr, werr)
}

func (r *replicaConn) Close() error { return r.up.Close() }

// cutError is a body that ended before its Content-Length.
type cutError struct {
	got, want int64
	err       error
}

func (e *cutError) Error() string {
	return fmt.Sprintf("%s: body cut off after %d of %d bytes: %v", ErrBadRequest, e.got, e.want, e.err)
}
func (e *cutError) Unwrap() error { return ErrBadRequest }

// internalPath is the route a node serves its own copies on.
func internalPath(name string, step uint64, rest string) string {
	return "/v1/internal/checkpoints/" + name + "/steps/" + strconv.FormatUint(step, 10) + rest
}

// sendReplica PUTs a part's copy to the node at addr, streaming body.
func (s *Service) sendReplica(ctx context.Context, addr string, req PutRequest, body io.Reader) error {
	path := internalPath(req.Name, req.Step, "/parts/"+req.Part)
	if req.Repair {
		path += "?repair=1"
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Minute)
	defer cancel()
	resp, err := s.peers.Do(ctx, http.MethodPut, addr, path, body, req.Size, http.Header{api.HeaderChecksum: {req.Sum}})
	if err != nil {
		return fmt.Errorf("%w: partner copy to %s: %w", ErrUnavailable, addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		return answerError(resp)
	}
	return nil
}

// answerError turns another node's non-2xx answer into an *api.Error with
// its status, so the client sees what the partner said (507, 409, …).
func answerError(resp *http.Response) error {
	e := relay.AnswerError(resp)
	e.Message = "partner: " + e.Message
	return e
}

// CopyTo sends this node's copy of a committed part to the node at addr
// (re-replication). addr must be a live member's: the copy carries the
// node's credentials, which go nowhere else.
func (s *Service) CopyTo(ctx context.Context, name string, step uint64, part, addr string) error {
	if !s.memberAddr(addr) {
		return fmt.Errorf("%w: copy to %q: not a live member's address", ErrBadRequest, addr)
	}
	k := partKey{name, step, part}
	h, ok := s.mem.get(k)
	if !ok {
		return fmt.Errorf("%w: %s step %d part %s is not held here", catalog.ErrNotFound, name, step, part)
	}
	defer h.release()
	if want, committed := s.committedSum(k); committed && want != h.sum {
		s.dropBadCopy(k, h.sum, want)
		return fmt.Errorf("%w: %s step %d part %s: the copy here is not the committed one (dropped)", ErrUnavailable, name, step, part)
	}
	return s.sendReplica(ctx, addr, PutRequest{Name: name, Step: step, Part: part, Sum: h.sum, Size: int64(len(h.data)),
		Replica: true, Repair: true}, bytes.NewReader(h.data))
}

// memberAddr reports whether addr is a live member's HTTP address.
func (s *Service) memberAddr(addr string) bool {
	for _, m := range s.members.Members() {
		if a, ok := s.members.MemberHTTP(m); ok && a == addr {
			return true
		}
	}
	return false
}
