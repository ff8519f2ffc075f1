// Package clairvoyant is the cache policy that knows the future (NoPFS,
// Lobster): every registered job's seeded order is known, so this node knows
// when each of its items is used next. It reads ahead what loaders will need
// within a bounded window, and makes room by dropping the resident item used
// farthest in the future — never one needed sooner than the incoming item.
// With a fresh permutation every epoch, no policy reads less from storage
// than MinIO; what foresight buys is time: the reads happen before the loader
// asks.
package clairvoyant

import (
	"container/heap"
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"stallfree/catalog"
	"stallfree/locality"
	"stallfree/store"
)

const (
	never          = int64(math.MaxInt64)
	prefetchWindow = 4 // global minibatches ahead of the fastest rank
	prefetchers    = 4 // concurrent storage reads for read-ahead
	// lagSteps lets a slower rank still use an item whose global minibatch the
	// fastest rank has passed.
	lagSteps = 2
)

// cursor follows one job through its epochs.
type cursor struct {
	job         string
	dataset     uint32
	cur, next   *locality.EpochPlan
	nextMembers []string     // the members next was computed with (pinned or predicted)
	steps       int64        // global minibatches per epoch
	pos         atomic.Int64 // absolute step (epoch*steps + step) of the fastest rank seen
	lastUse     []atomic.Int64
}

func (c *cursor) times(i int) (int64, int64) {
	c1, c2 := never, never
	if s := c.cur.Step[i]; s >= 0 {
		c1 = int64(c.cur.Epoch)*c.steps + int64(s)
	}
	if c.next != nil {
		if s := c.next.Step[i]; s >= 0 {
			c2 = int64(c.next.Epoch)*c.steps + int64(s)
		}
	}
	return c1, c2
}

// nextUse is the absolute step at which item i is used next by this job.
func (c *cursor) nextUse(i int) int64 {
	c1, c2 := c.times(i)
	last, pos := c.lastUse[i].Load(), c.pos.Load()
	if c1 != never && c1 > last && c1 >= pos-lagSteps {
		return c1
	}
	if c2 != never && c2 > last {
		return c2
	}
	return never
}

// due reports whether item i's next use is near this job's position.
func (c *cursor) due(i int) bool {
	t := c.nextUse(i)
	return t != never && t <= c.pos.Load()+prefetchWindow+lagSteps
}

// observe records that item i was requested.
func (c *cursor) observe(i int) {
	c1, c2 := c.times(i)
	pos := c.pos.Load()
	t := c1
	if c2 != never && (c1 == never || abs(c2-pos) < abs(c1-pos)) {
		t = c2
	}
	if t == never {
		return
	}
	c.lastUse[i].Store(t)
	for {
		p := c.pos.Load()
		if t <= p || c.pos.CompareAndSwap(p, t) {
			return
		}
	}
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// schedule holds the cursors of every job, by dataset.
type schedule struct {
	mu        sync.RWMutex
	byDataset map[uint32][]*cursor
	byJob     map[string]*cursor
	wake      chan struct{}

	prefetched, prefetchHits, prefetchWaste *prometheus.CounterVec
}

func newSchedule() *schedule {
	vec := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: "stallfree_" + name, Help: help}, []string{"job"})
	}
	return &schedule{byDataset: map[uint32][]*cursor{}, byJob: map[string]*cursor{}, wake: make(chan struct{}, 1),
		prefetched:    vec("prefetched_items_total", "Items read ahead of the loader by the clairvoyant policy."),
		prefetchHits:  vec("prefetch_hits_total", "Read-ahead items that a loader then asked for."),
		prefetchWaste: vec("prefetch_wasted_total", "Read-ahead items evicted before any loader asked for them."),
	}
}

func (s *schedule) register(reg *prometheus.Registry) {
	reg.MustRegister(s.prefetched, s.prefetchHits, s.prefetchWaste)
}

// clock is a global, monotonic time: the mean of the jobs' positions. For
// one job, clock + (nextUse - pos) is exactly the absolute next use, so
// priorities computed at different moments stay comparable; for jobs moving
// at similar speeds the mean advances as each of them does.
func (s *schedule) clock() int64 {
	if len(s.byJob) == 0 {
		return 0
	}
	var t int64
	for _, c := range s.byJob {
		t += c.pos.Load()
	}
	return t / int64(len(s.byJob))
}

// priority is when key is needed next on the global clock (never = not known
// to be needed). Callers hold s.mu for reading.
func (s *schedule) priority(k store.Key) int64 {
	best := never
	for _, c := range s.byDataset[k.Dataset()] {
		if int(k.Index()) >= len(c.lastUse) {
			continue
		}
		if t := c.nextUse(int(k.Index())); t != never {
			best = min(best, t-c.pos.Load())
		}
	}
	if best == never {
		return never
	}
	return s.clock() + best
}

// observe records a request for an item. With the job known (a job's batch
// route) only that job's cursor moves; otherwise every job for which the item
// is due about now takes it as its use, so one job's reads do not mark
// another's future uses as done.
func (s *schedule) observe(dataset uint32, index int, job string) {
	s.mu.RLock()
	for _, c := range s.byDataset[dataset] {
		if index >= len(c.lastUse) || (job != "" && c.job != job) {
			continue
		}
		if job != "" || c.due(index) {
			c.observe(index)
		}
	}
	s.mu.RUnlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// policy is the store policy: a max-heap of resident items by next use,
// invalidated lazily (an entry is current only while its generation matches).
type policy struct {
	s    *schedule
	keys []store.Key
	gen  []uint32
	live []bool
	// prefetched marks read-ahead items not yet asked for, with their job.
	// Its own lock: the store calls Removed under the store lock, node code
	// marks and clears entries without it.
	pmu        sync.Mutex
	prefetched map[store.Key]string
	h          prioHeap
}

type prioEntry struct {
	prio int64
	slot uint32
	gen  uint32
}

type prioHeap []prioEntry

func (h prioHeap) Len() int           { return len(h) }
func (h prioHeap) Less(i, j int) bool { return h[i].prio > h[j].prio }
func (h prioHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *prioHeap) Push(x any)        { *h = append(*h, x.(prioEntry)) }
func (h *prioHeap) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}

func newPolicy(s *schedule) *policy {
	return &policy{s: s, prefetched: map[store.Key]string{}}
}

func (p *policy) Name() string { return "clairvoyant" }

func (p *policy) track(slot uint32, k store.Key) {
	for uint32(len(p.keys)) <= slot {
		p.keys = append(p.keys, 0)
		p.gen = append(p.gen, 0)
		p.live = append(p.live, false)
	}
	p.keys[slot], p.live[slot] = k, true
	p.gen[slot]++
	p.s.mu.RLock()
	prio := p.s.priority(k)
	p.s.mu.RUnlock()
	heap.Push(&p.h, prioEntry{prio: prio, slot: slot, gen: p.gen[slot]})
}

func (p *policy) Added(slot uint32, k store.Key)    { p.track(slot, k) }
func (p *policy) Accessed(slot uint32, k store.Key) { p.track(slot, k) }

func (p *policy) Removed(slot uint32, k store.Key) {
	p.live[slot] = false
	p.gen[slot]++
	p.pmu.Lock()
	job, ok := p.prefetched[k]
	delete(p.prefetched, k)
	p.pmu.Unlock()
	if ok {
		p.s.prefetchWaste.WithLabelValues(job).Inc()
	}
}

// Victim proposes the resident item used farthest in the future, unless it
// is needed sooner than the incoming item. A priority is taken when its item
// is touched, and jobs move at their own speeds, so it goes stale: an item
// ranked far when one job was behind may be needed next now that it has
// caught up. The top is ranked again with its current priority until it
// holds (each entry at most about once a call: jobs keep moving meanwhile),
// and only the current priority is judged.
func (p *policy) Victim(incoming store.Key) (uint32, bool) {
	p.s.mu.RLock()
	defer p.s.mu.RUnlock()
	want := p.s.priority(incoming)
	for reranked := 0; p.h.Len() > 0; {
		top := p.h[0]
		if !p.live[top.slot] || p.gen[top.slot] != top.gen {
			heap.Pop(&p.h)
			continue
		}
		now := p.s.priority(p.keys[top.slot])
		if now != top.prio && reranked < p.h.Len() {
			p.h[0].prio = now
			heap.Fix(&p.h, 0)
			reranked++
			continue
		}
		if now > want {
			return top.slot, true
		}
		return 0, false
	}
	return 0, false
}

// Rebuild recomputes every resident item's priority (a new epoch's order).
func (p *policy) Rebuild() {
	p.h = p.h[:0]
	p.s.mu.RLock()
	defer p.s.mu.RUnlock()
	for slot, ok := range p.live {
		if ok {
			p.gen[slot]++
			p.h = append(p.h, prioEntry{prio: p.s.priority(p.keys[slot]), slot: uint32(slot), gen: p.gen[slot]})
		}
	}
	heap.Init(&p.h)
}

// Host is what the policy needs from its node: the jobs in the catalog, their
// epoch plans, which items this node owns, and a way to fill one.
type Host interface {
	Jobs() []*catalog.Job
	LatestEpoch(job string) (uint64, bool)
	EpochMembers(job string, epoch uint64) ([]string, bool)
	// Plan is an epoch's pinned plan; PredictPlan the plan it will have if
	// pinned to today's members, with those members, pinning nothing.
	Plan(job string, epoch uint64) (*locality.EpochPlan, error)
	PredictPlan(job string, epoch uint64) (*locality.EpochPlan, []string, error)
	Owns(d *catalog.Dataset, index int) bool
	// Fill brings an item this node owns into its store, as a miss would.
	Fill(ctx context.Context, d *catalog.Dataset, index int) error
}

// Clairvoyant is the policy and its read-ahead. Give Policy() to the store,
// then Start it with the store and the host.
type Clairvoyant struct {
	sched  *schedule
	policy *policy
	host   Host
	store  *store.Store
	wg     sync.WaitGroup
}

// New returns a policy with no jobs yet.
func New() *Clairvoyant {
	s := newSchedule()
	return &Clairvoyant{sched: s, policy: newPolicy(s)}
}

// Policy is the store.Policy to create the store with.
func (c *Clairvoyant) Policy() store.Policy { return c.policy }

// Register adds the read-ahead counters to reg.
func (c *Clairvoyant) Register(reg *prometheus.Registry) { c.sched.register(reg) }

// Start follows the jobs and reads ahead until ctx ends; Wait waits for that.
func (c *Clairvoyant) Start(ctx context.Context, host Host, st *store.Store) {
	c.host, c.store = host, st
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		c.prefetchLoop(ctx)
	}()
}

// Wait returns once Start's work has ended (after its context is done).
func (c *Clairvoyant) Wait() { c.wg.Wait() }

func (c *Clairvoyant) markPrefetched(k store.Key, job string) {
	c.policy.pmu.Lock()
	c.policy.prefetched[k] = job
	c.policy.pmu.Unlock()
	c.sched.prefetched.WithLabelValues(job).Inc()
}

func (c *Clairvoyant) notePrefetchHit(k store.Key) {
	c.policy.pmu.Lock()
	job, ok := c.policy.prefetched[k]
	delete(c.policy.prefetched, k)
	c.policy.pmu.Unlock()
	if ok {
		c.sched.prefetchHits.WithLabelValues(job).Inc()
	}
}

// Observe tells the schedule that an item was asked for, by job when known.
// Callers look the item up in the store first and observe after: observing
// first moves the item's next use to a later epoch, which makes it the
// read-ahead's favourite victim in the instant before the loader's lookup.
func (c *Clairvoyant) Observe(dataset uint32, index int, job string) {
	k := store.MakeKey(dataset, uint32(index))
	c.sched.observe(dataset, index, job)
	if c.store != nil {
		c.store.Retrack(k) // the lookup's priority predates the use
	}
	c.notePrefetchHit(k)
}

// Refresh follows the jobs in the catalog: each job's cursor sits on
// its latest pinned epoch (loaders pin an epoch when they ask for its order),
// and sees past the epoch boundary with the next epoch's plan, pinned or
// predicted from today's members.
func (c *Clairvoyant) Refresh() {
	changed := false
	seen := map[string]bool{}
	for _, j := range c.host.Jobs() {
		seen[j.Name] = true
		latest, ok := c.host.LatestEpoch(j.Name)
		if !ok {
			continue
		}
		c.sched.mu.RLock()
		old := c.sched.byJob[j.Name]
		c.sched.mu.RUnlock()
		if old != nil && old.cur.Job.Version == j.Version && old.cur.Epoch == latest {
			pinned, ok := c.host.EpochMembers(j.Name, latest+1)
			if !ok || slices.Equal(pinned, old.nextMembers) {
				continue
			}
		}
		cur, err := c.host.Plan(j.Name, latest)
		if err != nil {
			continue
		}
		next, nextMembers, err := c.host.PredictPlan(j.Name, latest+1)
		if err != nil {
			next = nil
		}
		steps := int64(cur.Batches())
		nc := &cursor{job: j.Name, dataset: cur.Data.ID, cur: cur, next: next, nextMembers: nextMembers, steps: steps}
		if old != nil && old.cur.Job.Version == j.Version && len(old.lastUse) == cur.Data.Manifest.Len() {
			nc.lastUse = old.lastUse
			nc.pos.Store(max(old.pos.Load(), int64(latest)*steps))
		} else {
			nc.lastUse = make([]atomic.Int64, cur.Data.Manifest.Len())
			for i := range nc.lastUse {
				nc.lastUse[i].Store(-1)
			}
			nc.pos.Store(int64(latest) * steps)
		}
		c.sched.mu.Lock()
		c.sched.byJob[j.Name] = nc
		c.sched.byDataset[nc.dataset] = replaceCursor(c.sched.byDataset[nc.dataset], nc)
		c.sched.mu.Unlock()
		changed = true
	}
	c.sched.mu.Lock()
	for name, old := range c.sched.byJob {
		if !seen[name] {
			delete(c.sched.byJob, name)
			c.sched.byDataset[old.dataset] = removeCursor(c.sched.byDataset[old.dataset], name)
			changed = true
		}
	}
	c.sched.mu.Unlock()
	if changed {
		c.store.Reprioritize()
		select { // start reading ahead for the new epoch now
		case c.sched.wake <- struct{}{}:
		default:
		}
	}
}

func replaceCursor(cs []*cursor, c *cursor) []*cursor {
	return append(removeCursor(cs, c.job), c)
}

func removeCursor(cs []*cursor, job string) []*cursor {
	out := cs[:0:0]
	for _, x := range cs {
		if x.job != job {
			out = append(out, x)
		}
	}
	return out
}

// prefetchLoop reads ahead, for every job, the items this node owns that the
// next prefetchWindow global minibatches use, while the store will take them.
func (c *Clairvoyant) prefetchLoop(ctx context.Context) {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	refresh := time.NewTicker(200 * time.Millisecond)
	defer refresh.Stop()
	sem := make(chan struct{}, prefetchers)
	var inflight sync.Map
	for {
		select {
		case <-ctx.Done():
			return
		case <-refresh.C:
			c.Refresh()
			continue
		case <-c.sched.wake:
		case <-t.C:
		}
		c.sched.mu.RLock()
		cursors := make([]*cursor, 0, len(c.sched.byJob))
		for _, c := range c.sched.byJob {
			cursors = append(cursors, c)
		}
		c.sched.mu.RUnlock()
		for _, cur := range cursors {
			c.prefetchJob(ctx, cur, sem, &inflight)
		}
	}
}

func (c *Clairvoyant) prefetchJob(ctx context.Context, cur *cursor, sem chan struct{}, inflight *sync.Map) {
	pos := cur.pos.Load()
	for t := pos; t < pos+prefetchWindow; t++ {
		ep := cur.cur
		if t >= int64(cur.cur.Epoch+1)*cur.steps {
			ep = cur.next
		}
		if ep == nil || cur.steps == 0 {
			return
		}
		b := int(t - int64(ep.Epoch)*cur.steps)
		if b < 0 || b >= ep.Batches() {
			continue
		}
		for r := range ep.Ranks {
			for _, i := range ep.BatchItems(r, b) {
				if !c.prefetchOne(ctx, cur, ep, t, int(i), sem, inflight) {
					return
				}
			}
		}
	}
}

// prefetchOne starts a read-ahead of item i if it is this node's, not
// resident and admissible. It returns false when the store would refuse it:
// later items are needed even later, so the window is done.
func (c *Clairvoyant) prefetchOne(ctx context.Context, cur *cursor, ep *locality.EpochPlan, t int64, i int, sem chan struct{}, inflight *sync.Map) bool {
	if !c.host.Owns(ep.Data, i) {
		return true
	}
	if cur.nextUse(i) != t {
		return true // already used at this step: its next use is outside the window
	}
	k := store.MakeKey(ep.Data.ID, uint32(i))
	if c.store.Contains(k) {
		return true
	}
	if _, busy := inflight.Load(k); busy {
		return true
	}
	if !c.store.MakeRoom(k, int(ep.Data.Manifest.Size(i))) {
		return false
	}
	// At most `prefetchers` reads ahead at once: the rest of storage
	// bandwidth stays with loaders' misses.
	select {
	case sem <- struct{}{}:
	case <-ctx.Done():
		return false
	}
	inflight.Store(k, struct{}{})
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer func() { <-sem; inflight.Delete(k) }()
		fctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		err := c.host.Fill(fctx, ep.Data, i)
		c.store.Unreserve(k) // a no-op when the fill used the room
		// Count it as read ahead only if no loader asked for it meanwhile.
		if err == nil && c.store.Contains(k) && cur.nextUse(i) == t {
			c.markPrefetched(k, cur.job)
		}
	}()
	return true
}
