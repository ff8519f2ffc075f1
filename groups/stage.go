package groups

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"slices"
	"time"

	"stallfree/api"
	"stallfree/catalog"
)

// keptDone bounds the positions remembered as served to every attached job,
// per group: a late PUT of one of them is acknowledged instead of staged
// again (nobody would read it, and it would hold room for ever).
const keptDone = 1 << 14

// stage is one group at its owner: what is staged and what each job did.
// Every field is guarded by Service.mu.
type stage struct {
	spec    *catalog.Group
	jobs    []jobState
	staged  map[uint64]*batch
	bytes   uint64
	largest uint64 // the largest batch staged so far: the bound's "batch bytes"
	done    map[uint64]struct{}
	doneQ   []uint64
	// newest is the furthest position ever staged, valid when anyStaged:
	// what requests are in reach of (reach).
	newest    uint64
	anyStaged bool
	// changed is closed and replaced whenever a batch is staged or dropped
	// or a job detached: waiting requests look again.
	changed chan struct{}
	// retire is told of every batch dropped (its file outlives it briefly).
	retire func(*batch)
}

type jobState struct {
	seen     bool
	pos      uint64 // furthest position asked for or staged, valid when seen
	staged   bool   // has staged a batch; lastPut is valid
	lastPut  uint64
	detached bool
	from     uint64
	why      string
	prepared uint64
	served   uint64
	last     time.Time // last request's end (or the stage's start)
	inflight int
}

type batch struct {
	data []byte // the bytes, when they are not in a file (path)
	// path is the shared-memory file holding the bytes (Config.ShmDir),
	// size their length; "" when they are in data.
	path string
	size uint64
	// held is the file when it was handed over by its producer (a sealed
	// memfd, opened by path): closed, not removed, when the batch retires.
	held io.Closer
	ino  uint64 // held's inode and device
	dev  uint64
	has  []bool // job j staged or read it
}

func (b *batch) len() uint64 {
	if b.path != "" {
		return b.size
	}
	return uint64(len(b.data))
}

func newStage(spec *catalog.Group, now time.Time) *stage {
	st := &stage{spec: spec, jobs: make([]jobState, spec.Jobs), staged: map[uint64]*batch{},
		done: map[uint64]struct{}{}, changed: make(chan struct{})}
	for j := range st.jobs {
		st.jobs[j].last = now
	}
	return st
}

func (st *stage) notify() {
	close(st.changed)
	st.changed = make(chan struct{})
}

func (st *stage) detachedList() []Detached {
	var d []Detached
	for j, js := range st.jobs {
		if js.detached {
			d = append(d, Detached{Job: j, From: js.from})
		}
	}
	return d
}

func (st *stage) producer(pos uint64) int {
	return Producer(st.spec.Jobs, st.spec.Batches(), st.detachedList(), pos)
}

// reach checks that job j may ask for position pos (epoch e) at all,
// before the request moves any position: a request far ahead would make the
// asker the "fastest job" and detach every other one. A job asks for its
// current epoch or the next (a job not seen yet: the furthest attached
// job's epoch or the next; in a stage nobody has asked of yet, any epoch,
// so a group may resume where its jobs left off), and for no batch past the
// newest staged one (or its epoch's first, when that is further) by more
// than ahead batches. Refusals are ErrConflict and change nothing.
func (st *stage) reach(j int, e, pos, ahead uint64) error {
	nb := uint64(max(st.spec.Batches(), 1))
	cur, known := uint64(0), false
	if js := st.jobs[j]; js.seen {
		cur, known = js.pos/nb, true
	} else {
		for _, o := range st.jobs {
			if o.seen && !o.detached && (!known || o.pos/nb > cur) {
				cur, known = o.pos/nb, true
			}
		}
	}
	if known && e != cur && e != cur+1 {
		return fmt.Errorf("%w: epoch %d: job %d is in epoch %d; it may ask for that epoch or the next", catalog.ErrConflict, e, j, cur)
	}
	base := e * nb
	if st.anyStaged && st.newest > base {
		base = st.newest
	}
	if pos > base+ahead {
		return fmt.Errorf("%w: batch %d of epoch %d is more than %d batches past the newest staged one", catalog.ErrConflict, pos-e*nb, e, ahead)
	}
	return nil
}

// touch records a request of job j at pos and applies the window: a job more
// than W batches behind the furthest job is detached.
func (st *stage) touch(j int, pos uint64) {
	js := &st.jobs[j]
	if !js.seen || pos > js.pos {
		js.pos = pos
	}
	js.seen = true
	var fastest uint64
	for _, o := range st.jobs {
		if o.seen && !o.detached {
			fastest = max(fastest, o.pos)
		}
	}
	w := uint64(st.spec.Window)
	for k := range st.jobs {
		if o := &st.jobs[k]; o.seen && !o.detached && fastest-o.pos > w {
			st.detach(k, fmt.Sprintf("more than %d batches behind the fastest job (at %d, fastest at %d)", w, o.pos, fastest))
		}
	}
}

// detach detaches job j for good: its share goes to the attached jobs from
// one past its last staged batch, and batches only it had yet to read are
// dropped.
func (st *stage) detach(j int, why string) {
	js := &st.jobs[j]
	if js.detached {
		return
	}
	js.detached, js.why, js.from = true, why, 0
	if js.staged {
		js.from = js.lastPut + 1
	}
	st.notify()
}

// putDone records that job j's PUT of pos ended with the batch staged (by
// it or by another job): its share up to pos is done.
func (st *stage) putDone(j int, pos uint64) {
	js := &st.jobs[j]
	if !js.staged || pos > js.lastPut {
		js.lastPut = pos
	}
	js.staged = true
}

// complete reports whether every attached job has batch b.
func (st *stage) complete(b *batch) bool {
	for j, js := range st.jobs {
		if !js.detached && !b.has[j] {
			return false
		}
	}
	return true
}

// sweep drops every staged batch that all attached jobs have, and returns
// the bytes freed.
func (st *stage) sweep() uint64 {
	var freed uint64
	for pos, b := range st.staged {
		if st.complete(b) {
			freed += st.drop(pos, b)
		}
	}
	return freed
}

func (st *stage) drop(pos uint64, b *batch) uint64 {
	delete(st.staged, pos)
	if st.retire != nil {
		st.retire(b)
	}
	n := b.len()
	st.bytes -= n
	st.markDone(pos)
	st.notify()
	return n
}

func (st *stage) markDone(pos uint64) {
	if _, ok := st.done[pos]; ok {
		return
	}
	st.done[pos] = struct{}{}
	st.doneQ = append(st.doneQ, pos)
	if len(st.doneQ) > keptDone {
		delete(st.done, st.doneQ[0])
		st.doneQ = st.doneQ[1:]
	}
}

// bound is W × J × batch bytes, with the largest batch seen (n included)
// standing for "batch bytes".
func (st *stage) fits(n uint64) bool {
	bound := uint64(st.spec.Window) * uint64(st.spec.Jobs) * max(st.largest, n)
	return st.bytes+n <= bound
}

func (st *stage) sameBytes(pos uint64, incoming func() ([]byte, error)) (staged, same bool) {
	b, ok := st.staged[pos]
	if !ok {
		return false, false
	}
	data, err := incoming()
	if err != nil {
		return true, false
	}
	if b.path != "" { // a second PUT of a batch: rare, so read back
		held, err := os.ReadFile(b.path)
		return true, err == nil && bytes.Equal(held, data)
	}
	return true, bytes.Equal(b.data, data)
}

func (st *stage) info(name, owner string) api.GroupInfo {
	g := st.spec
	in := api.GroupInfo{Name: name, Dataset: g.Dataset, Seed: g.Seed, BatchSize: g.BatchSize, Window: g.Window,
		Samples: g.Samples, Batches: g.Batches(), Version: g.Version, Jobs: make([]api.GroupJob, len(st.jobs)),
		StagedBatches: len(st.staged), StagedBytes: st.bytes, Owner: owner}
	nb := uint64(max(g.Batches(), 1))
	for j, js := range st.jobs {
		gj := api.GroupJob{Job: j, Detached: js.detached, Prepared: js.prepared, Served: js.served, Seen: js.seen, Why: js.why}
		if js.seen {
			gj.Epoch, gj.Batch = js.pos/nb, int(js.pos%nb)
		}
		if js.detached {
			from := js.from
			gj.From = &from
		}
		in.Jobs[j] = gj
	}
	slices.SortFunc(in.Jobs, func(a, b api.GroupJob) int { return a.Job - b.Job })
	return in
}
