package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"net/http"
	"slices"
	"time"

	"stallfree/api"
	"stallfree/catalog"
)

// Part is an open part: Size bytes whose sha256 is Sum. Close it.
type Part struct {
	io.ReadCloser
	Size int64
	Sum  string
	// From says which copy answered: "memory" (this node), "peer" or
	// "persisted".
	From string
}

// Open opens a part from any copy: this node's memory, a peer holding it,
// or, when no peer answers, the persisted copy. Bytes from a peer or the
// persisted store are checked against the sum as they stream: a mismatch
// ends the stream with an error before its last chunk, so a reader never
// sees a whole, wrong part. localOnly serves this node's own copy only (the
// internal route peers use). Only the local catalog is consulted.
func (s *Service) Open(ctx context.Context, name string, step uint64, part string, localOnly bool) (*Part, error) {
	if err := CheckName("checkpoint", name); err != nil {
		return nil, err
	}
	if err := CheckName("part", part); err != nil {
		return nil, err
	}
	k := partKey{name, step, part}
	if h, ok := s.mem.get(k); ok {
		want, committed := s.committedSum(k)
		if !committed || want == h.sum {
			return &Part{ReadCloser: &heldReader{h: h}, Size: int64(len(h.data)), Sum: h.sum, From: "memory"}, nil
		}
		h.release()
		s.dropBadCopy(k, h.sum, want) // and on to the other copies
	}
	notHere := fmt.Errorf("%w: checkpoint %s step %d part %s", catalog.ErrNotFound, name, step, part)
	if localOnly {
		return nil, notHere
	}
	ck, _ := s.cat.Checkpoint(name)
	st, committed := ck.Step(step)
	var (
		want       catalog.CheckpointPart
		candidates []string
	)
	if committed {
		var ok bool
		if want, ok = st.Part(part); !ok {
			return nil, notHere
		}
		live := s.live()
		candidates = slices.Clone(want.Holders)
		// Live holders first: a dead one costs a dial timeout.
		slices.SortStableFunc(candidates, func(a, b string) int { return boolInt(!live[a]) - boolInt(!live[b]) })
	} else {
		candidates = s.members.Members()
	}
	for _, m := range candidates {
		if m == s.cfg.Self {
			continue
		}
		p, err := s.openPeer(ctx, m, name, step, part, want.Sum)
		if err == nil {
			return p, nil
		}
		s.log.Debug("checkpoint: a copy did not answer", "member", m, "part", part, "err", err)
	}
	if committed && st.Persisted && s.persist != nil {
		rc, size, err := s.persist.Open(ctx, objectKey(name, step, part))
		if err != nil {
			return nil, fmt.Errorf("%w: no copy of %s step %d part %s in memory, and the persisted one: %w", ErrUnavailable, name, step, part, err)
		}
		if size != want.Size {
			rc.Close()
			return nil, fmt.Errorf("%w: persisted %s step %d part %s has %d bytes, want %d", ErrUnavailable, name, step, part, size, want.Size)
		}
		return &Part{ReadCloser: newVerifier(rc, size, want.Sum), Size: size, Sum: want.Sum, From: "persisted"}, nil
	}
	if committed {
		return nil, fmt.Errorf("%w: no copy of %s step %d part %s answers", ErrUnavailable, name, step, part)
	}
	return nil, notHere
}

// Mapped is this node's own copy of a part, held in a file in shared
// memory that a process on this host maps read-only.
type Mapped struct {
	Path string
	Size int64
	Sum  string
}

// MapLocal returns the file holding this node's copy of a part, when it
// holds one in shared memory (Config.ShmDir) and it is the committed
// bytes; false otherwise (the caller reads the part instead). The file stays
// while the part is held; once dropped it is removed, never reused, so a
// reader that mapped it keeps the bytes it was given.
func (s *Service) MapLocal(name string, step uint64, part string) (Mapped, bool) {
	if CheckName("checkpoint", name) != nil || CheckName("part", part) != nil {
		return Mapped{}, false
	}
	k := partKey{name, step, part}
	h, ok := s.mem.get(k)
	if !ok {
		return Mapped{}, false
	}
	defer h.release()
	if want, committed := s.committedSum(k); committed && want != h.sum {
		return Mapped{}, false // Open drops it and answers another copy
	}
	path, ok := s.mem.share(h)
	if !ok {
		return Mapped{}, false
	}
	return Mapped{Path: path, Size: int64(len(h.data)), Sum: h.sum}, true
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

// openPeer streams member m's own copy of a part; sum, when known, is
// what it must hash to.
func (s *Service) openPeer(ctx context.Context, m, name string, step uint64, part, sum string) (*Part, error) {
	addr, ok := s.members.MemberHTTP(m)
	if !ok {
		return nil, fmt.Errorf("no address for %s", m)
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	// A dead peer must not hold a restore for long; the body itself may
	// take as long as it takes.
	timer := time.AfterFunc(3*time.Second, cancel)
	resp, err := s.peers.Do(ctx, http.MethodGet, addr, internalPath(name, step, "/parts/"+part), nil, 0, nil)
	timer.Stop()
	if err != nil {
		cancel()
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		err := answerError(resp)
		resp.Body.Close()
		cancel()
		return nil, err
	}
	got := resp.Header.Get(api.HeaderChecksum)
	if sum == "" {
		sum = got
	}
	if got != sum || resp.ContentLength < 0 {
		resp.Body.Close()
		cancel()
		return nil, fmt.Errorf("%s holds another version of the part", m)
	}
	idle := s.cfg.PeerIdle
	if idle <= 0 {
		idle = replicaIdle
	}
	body := &cancelOnClose{ReadCloser: resp.Body, cancel: cancel, idle: idle}
	body.stall = time.AfterFunc(body.idle, cancel) // no byte for idle: the read fails
	return &Part{ReadCloser: newVerifier(body, resp.ContentLength, sum), Size: resp.ContentLength, Sum: sum, From: "peer"}, nil
}

// WriteTo sends the part to w: a held part in one write, any other copy
// through a 1 MiB buffer (fasthttp would otherwise copy through 4 KiB).
func (p *Part) WriteTo(w io.Writer) (int64, error) {
	if wt, ok := p.ReadCloser.(io.WriterTo); ok {
		return wt.WriteTo(w)
	}
	return io.CopyBuffer(writerOnly{w}, p.ReadCloser, make([]byte, 1<<20))
}

// writerOnly hides a ReadFrom, so io.CopyBuffer uses the buffer it is given.
type writerOnly struct{ io.Writer }

// cancelOnClose is a peer's answer body: closing it ends its request, and so
// does idle without a byte read (stall, when set), whatever else waits.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
	stall  *time.Timer
	idle   time.Duration
}

func (c *cancelOnClose) Read(p []byte) (int, error) {
	n, err := c.ReadCloser.Read(p)
	if n > 0 && c.stall != nil {
		c.stall.Reset(c.idle)
	}
	return n, err
}

func (c *cancelOnClose) Close() error {
	if c.stall != nil {
		c.stall.Stop()
	}
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}

// heldReader reads a held part and releases it on Close.
type heldReader struct {
	h   *held
	off int
}

func (r *heldReader) Read(p []byte) (int, error) {
	if r.off >= len(r.h.data) {
		return 0, io.EOF
	}
	n := copy(p, r.h.data[r.off:])
	r.off += n
	return n, nil
}

// WriteTo hands the whole part to w in one call (no intermediate copy).
func (r *heldReader) WriteTo(w io.Writer) (int64, error) {
	n, err := w.Write(r.h.data[r.off:])
	r.off += n
	return int64(n), err
}

func (r *heldReader) Close() error {
	if r.h != nil {
		r.h.release()
		r.h = nil
	}
	return nil
}

// verifier hashes a stream of known size and fails its last read when the
// sum is wrong, so the reader never gets all of a wrong part.
type verifier struct {
	rc   io.ReadCloser
	left int64
	sum  Checksum
	h    hash.Hash
}

func newVerifier(rc io.ReadCloser, size int64, sum string) *verifier {
	want, err := ParseChecksum(sum)
	if err != nil {
		want = Checksum{Algo: AlgoSHA256} // matches no body: the last read fails
	}
	return &verifier{rc: rc, left: size, sum: want, h: want.New()}
}

// errSum: bytes from another copy do not match the committed sum.
var errSum = errors.New("checkpoint part checksum mismatch")

func (v *verifier) Read(p []byte) (int, error) {
	if v.left <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > v.left {
		p = p[:v.left]
	}
	n, err := v.rc.Read(p)
	v.h.Write(p[:n])
	v.left -= int64(n)
	if v.left == 0 {
		if v.sum.Of(v.h) != v.sum {
			return 0, errSum
		}
		return n, io.EOF
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

func (v *verifier) Close() error { return v.rc.Close() }

// List answers GET /v1/checkpoints from the local catalog.
func (s *Service) List() []api.Checkpoint {
	live := s.live()
	out := []api.Checkpoint{}
	for _, ck := range s.cat.Checkpoints() {
		out = append(out, s.info(ck, live))
	}
	return out
}

// Get answers GET /v1/checkpoints/{name} from the local catalog.
func (s *Service) Get(name string) (api.Checkpoint, error) {
	if err := CheckName("checkpoint", name); err != nil {
		return api.Checkpoint{}, err
	}
	ck, ok := s.cat.Checkpoint(name)
	if !ok {
		return api.Checkpoint{}, fmt.Errorf("%w: no committed step of checkpoint %q", catalog.ErrNotFound, name)
	}
	return s.info(ck, s.live()), nil
}

func (s *Service) info(ck *catalog.Checkpoint, live map[string]bool) api.Checkpoint {
	out := api.Checkpoint{Name: ck.Name, Steps: []api.CheckpointStep{}}
	if l := ck.Latest(); l != nil {
		step := l.Step
		out.Latest = &step
	}
	for _, st := range ck.Steps {
		out.Steps = append(out.Steps, s.stepInfo(st, live))
	}
	return out
}

func (s *Service) stepInfo(st *catalog.CheckpointStep, live map[string]bool) api.CheckpointStep {
	out := api.CheckpointStep{Step: st.Step, Bytes: st.Bytes(), Persisted: st.Persisted, Parts: []string{},
		Checksums: []api.PartChecksum{}}
	if st.Meta != "" {
		out.Meta = json.RawMessage(st.Meta)
	}
	out.Replicas = -1
	for _, p := range st.Parts {
		out.Parts = append(out.Parts, p.Name)
		out.Checksums = append(out.Checksums, api.PartChecksum{Part: p.Name, Checksum: AlgoOf(p.Sum)})
		if n := liveCount(p.Holders, live); out.Replicas < 0 || n < out.Replicas {
			out.Replicas = n
		}
	}
	out.Replicas = max(out.Replicas, 0)
	return out
}

func liveCount(holders []string, live map[string]bool) int {
	n := 0
	for _, h := range holders {
		if live[h] {
			n++
		}
	}
	return n
}
