// Package node is one Stallfree cache node's item path: it ties the catalog,
// the store, the sources and its peers together and decides where each item
// comes from (memory, the owner's memory, storage), warms and rehomes items,
// and counts what it serves. The rules every caller of the catalog goes
// through (validation, the way to the raft leader, read-your-writes, epoch
// pinning) are package control's; the node opens the catalog and hands it to
// a control.Control (Control).
package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"

	"stallfree/bufpool"
	"stallfree/catalog"
	"stallfree/clairvoyant"
	"stallfree/cluster"
	"stallfree/clusterauth"
	"stallfree/control"
	"stallfree/derived"
	"stallfree/discovery"
	"stallfree/relay"
	"stallfree/source"
	"stallfree/store"
)

// ErrBadRequest is control's: a request that names an item, an index or a
// batch the catalog does not hold is as bad as a malformed registration.
var ErrBadRequest = control.ErrBadRequest

// Config is everything a node needs; cmd/cachenode fills it from flags.
type Config struct {
	Name       string
	HTTPAdvert string // host:port clients and peers use for HTTP
	PeerAdvert string // host:port of the peer transport
	RaftBind   string
	RaftAdvert string
	DataDir    string
	Bootstrap  bool
	Memory     uint64
	// ShareItems keeps the item arena in a memfd that loaders on this host
	// map read-only (LocateMany; store.NewShared). A node where that fails
	// keeps it in anonymous memory and says so.
	ShareItems   bool
	Policy       string
	AllowSources []string
	SourceRate   int64 // bytes/s per source, 0 = unlimited (for simulating slow storage)
	// S3 is how s3:// datasets are reached (endpoint, region, credentials).
	S3     source.S3Config
	Logger *slog.Logger
	// Timing is how fast raft, gossip and rehoming react: LANTiming (the
	// zero Timing means it) or LocalTiming (cachenode --timing).
	Timing Timing

	// Cluster settings. With no GossipBind the node runs alone.
	GossipBind  string
	Advertise   string // IP others use to reach this node
	Join        []string
	PeerBind    string
	ClusterKey  []byte        // raw --cluster-key-file contents; empty = no encryption or authentication
	PeerTimeout time.Duration // bound on a peer fetch before falling back to storage
	// DeadGrace is how long a member stays dead before it leaves the raft configuration.
	DeadGrace time.Duration
	// StorageTimeout bounds every storage read (0: 30 s); StorageReaders
	// bounds the reads in flight per source (0: 64).
	StorageTimeout time.Duration
	StorageReaders int
	// MaxInflightBytes bounds the bytes of responses being assembled at once
	// (batches, job batches, peer answers); 0: a quarter of Memory, at
	// least 256 MiB.
	MaxInflightBytes uint64
	// Datasets are the --dataset NAME=SOURCE flags: the node is not ready
	// until each is registered.
	Datasets []string
	// MaxPeerConns bounds the peer connections accepted at once (0: none).
	MaxPeerConns int
	// Token is the API's bearer token, which this node presents when it
	// relays a request to the raft leader.
	Token string
	// Socket is the Unix socket the API is also served on ("" none), shown
	// as the self member's "socket" in GET /v1/cluster.
	Socket string
	// Resolver looks up host names among the Join seeds (nil: the system's).
	Resolver discovery.Resolver
	// MaxItemBytes bounds an item a loader writes to a derived dataset
	// (0: derived.DefaultMaxItemBytes).
	MaxItemBytes int64
}

// Timing is a node's timing profile, one per package that keeps time.
type Timing struct {
	Catalog catalog.Timing
	Cluster cluster.Timing
	// Rehome is how often the node looks whether membership has settled
	// and copies left by earlier rings should move to their owners.
	Rehome time.Duration
}

// LANTiming is for hosts on one network.
func LANTiming() Timing {
	return Timing{Catalog: catalog.LANTiming(), Cluster: cluster.LANTiming(), Rehome: 2 * time.Second}
}

// LocalTiming is for nodes on one host: loopback tests and demos.
func LocalTiming() Timing {
	return Timing{Catalog: catalog.LocalTiming(), Cluster: cluster.LocalTiming(), Rehome: 300 * time.Millisecond}
}

// TimingNamed is the profile cachenode's --timing names: "lan" or "local".
func TimingNamed(name string) (Timing, error) {
	switch name {
	case "lan":
		return LANTiming(), nil
	case "local":
		return LocalTiming(), nil
	}
	return Timing{}, fmt.Errorf("timing %q: want lan or local", name)
}

// Node is safe for concurrent use.
type Node struct {
	cfg      Config
	log      *slog.Logger
	cat      *catalog.Catalog
	store    *store.Store
	bufs     bufpool.Pool // what storage reads are read into
	registry *prometheus.Registry
	counters counters
	flight   singleflight.Group

	mu      sync.Mutex
	sources map[uint32]*source.Bounded
	warmups map[string]*warmup
	owners  map[uint32]ownerMap // by dataset ID

	peers    Peers
	ctl      *control.Control
	inflight inflight

	jobMetrics *jobMetrics
	foresight  foresight
	split      splitState // quotas and the memory split (split.go)
	prep       *derived.Prep

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New opens the catalog and the store, and joins the cluster when
// cfg.GossipBind is set.
func New(cfg Config) (*Node, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	var (
		pol  store.Policy
		fore foresight = noForesight{}
		clv  *clairvoyant.Clairvoyant
		err  error
	)
	if cfg.Policy == "clairvoyant" {
		clv = clairvoyant.New()
		pol, fore = clv.Policy(), clv
	} else if pol, err = store.NewPolicy(cfg.Policy); err != nil {
		return nil, err
	}
	if cfg.AllowSources, err = control.Resolve(cfg.AllowSources); err != nil {
		return nil, err
	}
	if cfg.RaftAdvert == "" {
		cfg.RaftAdvert = cfg.RaftBind
	}
	if cfg.StorageTimeout <= 0 {
		cfg.StorageTimeout = 30 * time.Second
	}
	if cfg.StorageReaders <= 0 {
		cfg.StorageReaders = 64
	}
	if cfg.Timing == (Timing{}) {
		cfg.Timing = LANTiming()
	}
	if cfg.MaxInflightBytes == 0 {
		cfg.MaxInflightBytes = max(cfg.Memory/4, 256<<20)
	}
	st, err := newStore(cfg, pol)
	if err != nil {
		return nil, err
	}
	cat, err := catalog.Open(catalog.Config{NodeID: cfg.Name, Bind: cfg.RaftBind, Advertise: cfg.RaftAdvert,
		Dir: cfg.DataDir, Bootstrap: cfg.Bootstrap, Rejoin: len(cfg.Join) > 0, Logger: cfg.Logger, Timing: cfg.Timing.Catalog,
		Key: clusterauth.Derive(cfg.ClusterKey, "raft")})
	if err != nil {
		st.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &Node{cfg: cfg, log: cfg.Logger, cat: cat, store: st, sources: map[uint32]*source.Bounded{}, owners: map[uint32]ownerMap{},
		warmups: map[string]*warmup{}, ctx: ctx, cancel: cancel, foresight: fore, peers: newNoPeers(cfg.Name)}
	n.split = newSplitState()
	// One client to the other nodes' APIs for every part of this node
	// (control's relays, the prep cache; the rest get it from control).
	rc := relay.New(cfg.Name, cfg.Token, relay.MemberKey(memberKey(cfg.ClusterKey)))
	n.prep = derived.New(derived.Config{Name: cfg.Name, Relay: rc, MaxItemBytes: cfg.MaxItemBytes, Logger: cfg.Logger},
		cat, st, derivedHost{n})
	n.inflight.limit = cfg.MaxInflightBytes
	n.registry = n.registerMetrics()
	n.jobMetrics = newJobMetrics(n.registry)
	var cl *cluster.Cluster
	if cfg.GossipBind != "" {
		cl = cluster.New(cluster.Config{Name: cfg.Name, GossipBind: cfg.GossipBind, Advertise: cfg.Advertise,
			Join: cfg.Join, PeerBind: cfg.PeerBind, ClusterKey: cfg.ClusterKey, HTTPAdvert: cfg.HTTPAdvert,
			PeerAdvert: cfg.PeerAdvert, RaftAdvert: cfg.RaftAdvert, Capacity: cfg.Memory, PeerTimeout: cfg.PeerTimeout,
			DeadGrace: cfg.DeadGrace, Timing: cfg.Timing.Cluster, Logger: cfg.Logger, MaxPeerConns: cfg.MaxPeerConns, Resolver: cfg.Resolver},
			forPeers{n}, cat, st)
		n.peers = cl
	}
	// Before the cluster starts: a peer's first request may open a source,
	// which --allow-source (control) guards.
	n.ctl = control.New(control.Config{Name: cfg.Name, HTTPAdvert: cfg.HTTPAdvert, Relay: rc,
		AllowSources: cfg.AllowSources, S3: cfg.S3, Logger: cfg.Logger, Replanned: fore.Refresh,
		RelayedRead: func() { n.counters.relayedReads.Add(1) }}, cat, members{n})
	if cl != nil {
		if err := cl.Start(); err != nil {
			cancel()
			cat.Close()
			st.Close()
			return nil, err
		}
	}
	if clv != nil {
		clv.Register(n.registry)
		clv.Start(ctx, clairvoyantHost{n}, st)
	}
	n.wg.Add(1)
	go n.watchCatalog()
	n.wg.Add(1)
	go n.Split().quotaLoop()
	n.wg.Go(func() { n.ctl.RunCatchup(ctx, 10*time.Millisecond) }) // local checks until a leader is known; one request then
	if cfg.GossipBind != "" {
		// Alone, a node owns everything: nothing to move, nothing to rewarm.
		n.wg.Add(1)
		go n.rehomeLoop(cfg.Timing.Rehome)
	}
	return n, nil
}

// Leave takes this node out of the cluster before a clean stop: gossip sees
// it leave and raft removes it from the voters, so the members that stay keep
// their quorum (cluster.Leave). A node alone has nothing to leave. Call it
// before Close; Close alone is what a crash looks like to the others.
func (n *Node) Leave(ctx context.Context) error { return n.peers.Leave(ctx) }

// Close stops background work and releases everything.
func (n *Node) Close() error {
	n.peers.Close()
	n.cancel()
	n.foresight.Wait()
	n.wg.Wait()
	err := n.cat.Close()
	n.mu.Lock()
	for id, s := range n.sources {
		s.Close()
		delete(n.sources, id)
	}
	n.mu.Unlock()
	n.store.Close()
	n.ctl.Relay().Close()
	return err
}

// Ready reports whether the node serves as the cluster expects: it has
// joined, its catalog has caught up with the leader, and every --dataset is
// registered. When not, reason says what it is waiting for.
func (n *Node) Ready() (ok bool, reason string) {
	if !n.peers.Joined() {
		return false, "not joined to the cluster yet"
	}
	if ok, why := n.cat.CaughtUp(); !ok {
		return false, why
	}
	if ok, why := n.ctl.CatalogReady(); !ok {
		return false, why
	}
	for _, spec := range n.cfg.Datasets {
		if name, _, _ := strings.Cut(spec, "="); !n.ctl.HasDataset(name) {
			return false, fmt.Sprintf("--dataset %s not registered yet", name)
		}
	}
	return true, ""
}

// Name is the node's stable name.
func (n *Node) Name() string { return n.cfg.Name }

// Control is the catalog's rules as this node applies them: registrations,
// jobs, epoch plans, the way to the leader.
func (n *Node) Control() *control.Control { return n.ctl }

// Registry holds the node's Prometheus metrics.
func (n *Node) Registry() *prometheus.Registry { return n.registry }

// watchCatalog drops cached items and source handles of deleted datasets.
func (n *Node) watchCatalog() {
	defer n.wg.Done()
	for {
		// Take the channel before looking, so a change made while this pass
		// runs wakes the next one.
		updated := n.cat.Updated()
		select {
		case <-n.ctx.Done():
			return
		case <-updated:
		}
		n.foresight.Refresh() // a newly pinned epoch: start reading ahead now
		n.prep.Sync()
		n.jobMetrics.forgetGone(func(job string) bool { _, ok := n.cat.Job(job); return ok })
		n.ctl.ForgetGoneJobs()
		live := map[uint32]bool{}
		for _, d := range n.cat.Datasets() {
			live[d.ID] = true
		}
		n.mu.Lock()
		for id, s := range n.sources {
			if !live[id] {
				s.Close()
				delete(n.sources, id)
				n.store.DeleteDataset(id)
			}
		}
		n.mu.Unlock()
		// Items of a version gone (deleted, or replaced by a refresh under
		// a new ID) go too, also where this node never opened its source
		// (it held them by handoff or push): a refreshed dataset's old
		// bytes must not linger, or be found under a reused key.
		for id := range n.store.Usage() {
			if !live[id] {
				n.store.DeleteDataset(id)
			}
		}
	}
}

func (n *Node) source(d *catalog.Dataset) (*source.Bounded, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if s, ok := n.sources[d.ID]; ok {
		return s, nil
	}
	opened, err := source.Open(d.Source, source.Options{BytesPerSecond: n.cfg.SourceRate, S3: n.cfg.S3})
	if err != nil {
		return nil, err
	}
	if err := n.ctl.AllowedOpened(d.Source, opened); err != nil {
		opened.Close()
		return nil, err
	}
	s := source.NewBounded(opened, n.cfg.StorageReaders, n.cfg.StorageTimeout)
	n.sources[d.ID] = s
	return s, nil
}

// Cache tells where an item came from, as in the X-Cache header.
type Cache string

// Where an item came from.
const (
	Hit  Cache = "hit"
	Peer Cache = "peer"
	Miss Cache = "miss"
)

// Item is an item ready to serve: either pinned store bytes (release with
// Release) or bytes owned by the caller.
type Item struct {
	Key   string
	Data  []byte
	Sum   uint64
	Cache Cache
	// NotWritten marks an item of a derived dataset nobody has written
	// (GetManyPartial): no bytes.
	NotWritten bool
	ref        store.Ref
	// recycle hands back the transport buffer Data lives in, when this item
	// is its only user.
	recycle func()
	// charged is what this item holds of the in-flight budget.
	charged uint64
	budget  *inflight
}

// Release unpins store bytes or recycles the peer's bytes and gives back its
// share of the in-flight budget; Data must not be used afterwards.
func (it *Item) Release() {
	it.ref.Release()
	if it.recycle != nil {
		it.recycle()
		it.recycle = nil
	}
	if it.budget != nil {
		it.budget.give(it.charged)
		it.budget = nil
	}
}

// Get returns item index of dataset d: from this node's memory, from the
// owner's memory over the peer transport, or from storage.
func (n *Node) Get(ctx context.Context, d *catalog.Dataset, index int) (Item, error) {
	if index < 0 || index >= d.Manifest.Len() {
		return Item{}, fmt.Errorf("%w: index %d out of range [0,%d)", ErrBadRequest, index, d.Manifest.Len())
	}
	k := store.MakeKey(d.ID, uint32(index))
	key := d.Manifest.Key(index)
	ref, ok := n.store.Get(k)
	n.foresight.Observe(d.ID, index, "") // after the lookup: see clairvoyant.Observe
	if ok {
		n.counters.hitsLocal.Add(1)
		return Item{Key: key, Data: ref.Data, Sum: ref.Sum, Cache: Hit, ref: ref}, nil
	}
	// A fetched item is a fresh buffer held until the response is sent, to
	// a reader as slow as it likes: charged to --max-inflight-bytes as a
	// batch's are (16 slow readers of a 120 MiB item held 2 GB before).
	charged, err := n.inflight.takeItem(uint64(d.Manifest.Size(index)))
	if err != nil {
		return Item{}, err
	}
	f, err := n.fetch(ctx, d, index)
	if err == nil {
		charged, err = n.inflight.topUp(charged, uint64(len(f.data))) // a derived item's own size
		if err != nil {
			f.done()
		}
	}
	if err != nil {
		n.inflight.give(charged)
		return Item{}, err
	}
	n.counters.count(f.cache)
	return Item{Key: key, Data: f.data, Sum: f.sum, Cache: f.cache, recycle: f.recycle, charged: charged, budget: &n.inflight}, nil
}

func (c *counters) count(from Cache) {
	switch from {
	case Hit:
		c.hitsLocal.Add(1)
	case Peer:
		c.hitsPeer.Add(1)
	default:
		c.misses.Add(1)
	}
}

// shared runs fill once for an item however many callers want it at the
// same time (single flight), unless a flight that just ended left it resident.
func (n *Node) shared(ctx context.Context, d *catalog.Dataset, index int, fill func(context.Context) (filled, error)) (filled, error) {
	k := store.MakeKey(d.ID, uint32(index))
	v, err, shared := n.flight.Do(strconv.FormatUint(uint64(k), 36), func() (any, error) {
		// An item that became resident between the caller's store lookup
		// and this flight (a flight that just ended filled it) is served
		// from memory, as a copy: the flight's result outlives the pin.
		if f, ok := resident(n.store, k, Hit); ok {
			return f, nil
		}
		// A flight is shared, so it must not die with the first caller's request.
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		return fill(fctx)
	})
	if err != nil {
		return filled{}, fmt.Errorf("dataset %s item %d: %w", d.Name, index, err)
	}
	f := v.(filled)
	if shared {
		// Every caller holds these bytes and none knows when the others are
		// done: leave the buffer to the collector.
		f.recycle = nil
	}
	return f, nil
}

// fetch gets an item this node does not hold: from its owner, or when this
// node owns it, from its previous owner's memory or from storage.
func (n *Node) fetch(ctx context.Context, d *catalog.Dataset, index int) (filled, error) {
	return n.shared(ctx, d, index, func(ctx context.Context) (filled, error) {
		owner, self := n.peers.Owner(d, index)
		if !self {
			if f, ok := n.peers.FromOwner(ctx, owner, d, index); ok {
				return fromPeer(f), nil
			}
			// The owner is gone or hung: read storage here, and do not cache
			// what this node does not own.
			return n.readSource(ctx, d, index, false)
		}
		if f, ok := takeOver(ctx, n.peers, n.store, d, index); ok {
			return f, nil
		}
		return n.readSource(ctx, d, index, true)
	})
}

// fetchForPeer fills an item a peer asked for, never asking another owner
// (no request bounces between nodes): from storage once, shared with local
// callers, and cached only if this node owns it.
func (n *Node) fetchForPeer(ctx context.Context, d *catalog.Dataset, index int) (filled, error) {
	return n.shared(ctx, d, index, func(ctx context.Context) (filled, error) {
		_, self := n.peers.Owner(d, index)
		if self {
			if f, ok := takeOver(ctx, n.peers, n.store, d, index); ok {
				return f, nil
			}
		}
		return n.readSource(ctx, d, index, self)
	})
}

// takeOver gets an item this node owns but does not hold from its previous
// owner's memory (a handoff), or from this node's own memory: that owner's
// rehoming pushes the item here and then drops its copy, so a handoff asked
// after the push landed finds nothing though the item is here. Without that
// second look a derived item read as "not written", and any other was read
// from storage again. False: read storage.
func takeOver(ctx context.Context, peers Peers, st *store.Store, d *catalog.Dataset, index int) (filled, bool) {
	if f, ok := peers.Handoff(ctx, d, index); ok {
		return fromPeer(f), true
	}
	return resident(st, store.MakeKey(d.ID, uint32(index)), Peer)
}

// resident is item k from st, as a copy (a flight's result outlives the
// pin), counted as from.
func resident(st *store.Store, k store.Key, from Cache) (filled, bool) {
	ref, ok := st.Get(k)
	if !ok {
		return filled{}, false
	}
	defer ref.Release()
	return filled{data: bytes.Clone(ref.Data), sum: ref.Sum, cache: from}, true
}

type filled struct {
	data  []byte
	sum   uint64
	cache Cache
	// recycle, when set, hands data's buffer back for reuse; only the
	// flight's sole caller may call it, once it is done with data.
	recycle func()
}

func fromPeer(f cluster.Fill) filled {
	return filled{data: f.Data, sum: f.Sum, cache: Peer, recycle: f.Recycle}
}

// done is for callers that only wanted the item filled, not its bytes.
func (f filled) done() {
	if f.recycle != nil {
		f.recycle()
	}
}

// ReadUncached reads an item from storage and neither admits it nor counts
// it as a loader miss (it does count as a storage read).
func (n *Node) ReadUncached(ctx context.Context, d *catalog.Dataset, index int) (Item, error) {
	if index < 0 || index >= d.Manifest.Len() {
		return Item{}, fmt.Errorf("%w: index %d out of range", ErrBadRequest, index)
	}
	charged, err := n.inflight.takeItem(uint64(d.Manifest.Size(index))) // as Get's misses
	if err != nil {
		return Item{}, err
	}
	f, err := n.readSource(ctx, d, index, false)
	if err != nil {
		n.inflight.give(charged)
		return Item{}, err
	}
	return Item{Key: d.Manifest.Key(index), Data: f.data, Sum: f.sum, Cache: Miss, recycle: f.recycle,
		charged: charged, budget: &n.inflight}, nil
}

// readSource reads one item from storage and admits it when cache is set.
func (n *Node) readSource(ctx context.Context, d *catalog.Dataset, index int, cache bool) (filled, error) {
	if d.Derived() {
		return filled{}, catalog.ErrNotWritten // loaders write it; storage never has it
	}
	src, err := n.source(d)
	if err != nil {
		return filled{}, err
	}
	buf := n.bufs.Get(int(d.Manifest.Size(index)))
	n.split.meter.Start(d.ID)
	data, err := src.Read(ctx, d.Manifest.Entry(index), buf.B)
	n.split.meter.Done(d.ID, len(data))
	if err != nil {
		// A read abandoned at its deadline may still land in buf: leave
		// that buffer to the collector.
		if !errors.Is(err, source.ErrTimeout) && ctx.Err() == nil {
			n.bufs.Put(buf)
		}
		return filled{}, sourceChanged(d, index, err)
	}
	n.counters.sourceReads.Add(1)
	n.counters.sourceBytes.Add(uint64(len(data)))
	if cache {
		// The ring may have moved during the read: keep only what this node
		// still owns, or the copy would sit where nobody asks for it.
		_, cache = n.peers.Owner(d, index)
	}
	var sum uint64
	if cache {
		var err error
		if sum, err = n.store.PutSummed(store.MakeKey(d.ID, uint32(index)), data); err != nil && !errors.Is(err, store.ErrNotAdmitted) {
			n.bufs.Put(buf)
			return filled{}, err
		}
	} else {
		sum = xxhash.Sum64(data)
	}
	return filled{data: data, sum: sum, cache: Miss, recycle: func() { n.bufs.Put(buf) }}, nil
}

// GetManyFor returns several items in order, on behalf of a registered job
// (whose read-ahead schedule the request advances) or of none (""); on
// error, those already fetched are released. Items owned by one peer travel
// in one transport request.
func (n *Node) GetManyFor(ctx context.Context, d *catalog.Dataset, indices []int, job string) ([]Item, error) {
	return n.getMany(ctx, d, indices, job, false)
}

// GetManyPartial is GetManyFor for a derived dataset whose items may not
// all be written yet: those come back marked NotWritten instead of failing
// the batch, so that a loader learns in one request which items it has to
// compute (the prep cache's first epoch).
func (n *Node) GetManyPartial(ctx context.Context, d *catalog.Dataset, indices []int, job string) ([]Item, error) {
	return n.getMany(ctx, d, indices, job, true)
}

func (n *Node) getMany(ctx context.Context, d *catalog.Dataset, indices []int, job string, partial bool) ([]Item, error) {
	if err := CheckIndices(d, indices); err != nil {
		return nil, err
	}
	var total uint64
	for _, i := range indices {
		total += uint64(d.Manifest.Size(i))
	}
	if total > MaxBatchBytes {
		return nil, fmt.Errorf("%w: batch of %d bytes; the limit is %d", ErrTooLarge, total, MaxBatchBytes)
	}
	if err := n.inflight.take(total); err != nil {
		return nil, err
	}
	out := make([]Item, len(indices))
	// Each item gives its bytes back when released; the budget is whole
	// until then.
	for j, i := range indices {
		out[j].charged, out[j].budget = uint64(d.Manifest.Size(i)), &n.inflight
	}
	release := func() {
		for j := range out {
			out[j].Release()
		}
	}
	var missing []int // positions in out
	for j, i := range indices {
		ref, ok := n.store.Get(store.MakeKey(d.ID, uint32(i)))
		n.foresight.Observe(d.ID, i, job) // after the lookup: see clairvoyant.Observe
		if ok {
			n.counters.hitsLocal.Add(1)
			out[j] = Item{Key: d.Manifest.Key(i), Data: ref.Data, Sum: ref.Sum, Cache: Hit, ref: ref,
				charged: out[j].charged, budget: out[j].budget}
		} else {
			missing = append(missing, j)
		}
	}
	if len(missing) == 0 {
		return n.inflight.chargeHeld(out)
	}
	missing = n.fromOwners(ctx, d, indices, missing, out)
	// What is left is owned here or could not be fetched from its owner.
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for _, j := range missing {
		g.Go(func() error {
			f, err := n.fetch(gctx, d, indices[j])
			if partial && errors.Is(err, catalog.ErrNotWritten) {
				out[j].Key, out[j].NotWritten = d.Manifest.Key(indices[j]), true
				return nil
			}
			if err != nil {
				return err
			}
			n.counters.count(f.cache)
			out[j] = Item{Key: d.Manifest.Key(indices[j]), Data: f.data, Sum: f.sum, Cache: f.cache, recycle: f.recycle,
				charged: out[j].charged, budget: out[j].budget}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		release()
		return nil, err
	}
	return n.inflight.chargeHeld(out)
}

// fromOwners fetches the missing positions of out that other members own,
// one peer request per owner, and returns the positions still missing.
func (n *Node) fromOwners(ctx context.Context, d *catalog.Dataset, indices, missing []int, out []Item) []int {
	var remote, left []int // positions in out
	for _, j := range missing {
		if _, self := n.peers.Owner(d, indices[j]); self {
			left = append(left, j)
		} else {
			remote = append(remote, j)
		}
	}
	if len(remote) == 0 {
		return left
	}
	want := make([]int, len(remote))
	for x, j := range remote {
		want[x] = indices[j]
	}
	got, found := n.peers.FromOwners(ctx, d, want)
	for x, j := range remote {
		if !found[x] {
			left = append(left, j)
			continue
		}
		n.counters.hitsPeer.Add(1)
		out[j] = Item{Key: d.Manifest.Key(indices[j]), Data: got[x].Data, Sum: got[x].Sum, Cache: Peer,
			charged: out[j].charged, budget: out[j].budget}
	}
	return left
}

// ServedBytes counts bytes sent to clients.
func (n *Node) ServedBytes(b int) { n.counters.bytesServed.Add(uint64(b)) }
