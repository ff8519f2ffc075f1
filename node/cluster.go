package node

import (
	"stallfree/api"

	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/valyala/fasthttp"

	"stallfree/catalog"
	"stallfree/membership"
	"stallfree/partition"
	"stallfree/store"
	"stallfree/transport"
)

// maxVoters: raft stays fast with a small quorum; members beyond it follow
// the catalog as non-voters.
const maxVoters = 5

// cluster is the part of a node that exists only with peers: gossip, the
// ring, the peer transport and raft membership upkeep.
type cluster struct {
	n      *Node
	ml     *membership.Membership
	srv    *transport.Server
	client *transport.Client
	ln     net.Listener
	rings  atomic.Pointer[ringPair]
	ringMu sync.Mutex // one rebuild at a time, so prev is always the ring replaced
	http   *fasthttp.Client
	wg     sync.WaitGroup
	stop   chan struct{}
}

// ringPair keeps the rings a new owner consults to find who held an item
// before it, so ownership moves become transfers instead of storage reads:
// the previous ring (any membership change) and the current ring without this
// node (a join or rejoin: exactly the ring under which the items were filled).
type ringPair struct{ cur, prev, withoutSelf *partition.Ring }

// deriveKey separates the gossip and transport keys derived from one secret.
func deriveKey(secret []byte, label string) []byte {
	if len(secret) == 0 {
		return nil
	}
	h := sha256.New()
	h.Write([]byte("stallfree/" + label + "/"))
	h.Write(secret)
	return h.Sum(nil)
}

func startCluster(n *Node) (*cluster, error) {
	cfg := n.cfg
	if cfg.PeerTimeout == 0 {
		cfg.PeerTimeout = 2 * time.Second
		n.cfg.PeerTimeout = cfg.PeerTimeout
	}
	if n.cfg.DeadGrace == 0 {
		n.cfg.DeadGrace = time.Minute
		if cfg.FastRaft {
			n.cfg.DeadGrace = 5 * time.Second
		}
	}
	c := &cluster{n: n, client: transport.NewClient(deriveKey(cfg.ClusterKey, "transport")), stop: make(chan struct{}),
		http: &fasthttp.Client{ReadTimeout: time.Second, WriteTimeout: time.Second, MaxConnsPerHost: 4}}
	empty, _ := partition.New(nil)
	c.rings.Store(&ringPair{cur: empty})
	ln, err := net.Listen("tcp", cfg.PeerBind)
	if err != nil {
		return nil, fmt.Errorf("--peer: %w", err)
	}
	c.ln = ln
	c.srv = transport.NewServer(deriveKey(cfg.ClusterKey, "transport"), c.servePeer, n.log.With("component", "transport"))
	go c.srv.Serve(ln)

	var secret []byte
	if len(cfg.ClusterKey) > 0 {
		secret = deriveKey(cfg.ClusterKey, "gossip")
	}
	raftAdv := cfg.RaftAdvert
	if raftAdv == "" {
		raftAdv = cfg.RaftBind
	}
	ml, err := membership.Join(membership.Config{
		Name: cfg.Name, Bind: cfg.GossipBind, Advertise: cfg.Advertise, Join: cfg.Join, SecretKey: secret, Fast: cfg.FastRaft,
		Logger: n.log, Meta: membership.Meta{Incarnation: time.Now().UnixNano(), HTTP: cfg.HTTPAdvert, Peer: cfg.PeerAdvert,
			Raft: raftAdv, Capacity: cfg.Memory},
	})
	if err != nil {
		c.srv.Close()
		return nil, err
	}
	c.ml = ml
	c.rebuildRing()
	c.wg.Add(1)
	go c.watch()
	return c, nil
}

func (c *cluster) close() {
	close(c.stop)
	c.wg.Wait()
	c.ml.Leave(time.Second)
	c.srv.Close()
	c.client.Close()
}

func (c *cluster) ring() *partition.Ring { return c.rings.Load().cur }

// rebuildRing recomputes ownership over the alive members.
func (c *cluster) rebuildRing() {
	c.ringMu.Lock()
	defer c.ringMu.Unlock()
	alive := c.ml.Alive()
	old := c.rings.Load()
	if slices.Equal(old.cur.Members(), alive) {
		return
	}
	r, err := partition.New(alive)
	if err != nil {
		c.n.log.Error("ring not rebuilt", "members", alive, "err", err)
		return
	}
	others := slices.DeleteFunc(slices.Clone(alive), func(m string) bool { return m == c.n.cfg.Name })
	without, err := partition.New(others)
	if err != nil {
		without = nil
	}
	c.rings.Store(&ringPair{cur: r, prev: old.cur, withoutSelf: without})
	c.n.log.Info("ring", "members", alive, "version", r.Version(), "moved", partition.Moved(old.cur, r))
	// Connections to members that left are of no further use.
	for _, m := range c.ml.Members() {
		if m.State == membership.Dead || m.State == membership.Left {
			c.client.Forget(m.Meta.Peer)
		}
	}
}

// watch follows membership: it rebuilds the ring on every change, and on the
// raft leader keeps the voter set in line with the live members.
func (c *cluster) watch() {
	defer c.wg.Done()
	kick := make(chan struct{}, 1)
	c.wg.Add(1)
	go c.upkeepRaft(kick)
	for {
		select {
		case <-c.stop:
			return
		case <-c.ml.Changed():
			c.rebuildRing()
			select {
			case kick <- struct{}{}:
			default:
			}
		}
	}
}

// upkeepRaft runs apart from the ring rebuilds: a raft configuration change
// waits for a commit, and ownership must not lag membership meanwhile.
func (c *cluster) upkeepRaft(kick <-chan struct{}) {
	defer c.wg.Done()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-c.stop:
			return
		case <-kick:
		case <-t.C:
		}
		if c.n.cat.IsLeader() {
			if err := c.reconcileRaft(); err != nil {
				c.n.log.Warn("raft membership", "err", err)
			}
		}
	}
}

func (c *cluster) reconcileRaft() error {
	servers, err := c.n.cat.Servers()
	if err != nil {
		return err
	}
	inConf := map[string]catalog.Server{}
	voters := 0
	for _, s := range servers {
		inConf[s.ID] = s
		if s.Voter {
			voters++
		}
	}
	for _, m := range c.ml.Members() {
		s, known := inConf[m.Name]
		switch {
		case m.State == membership.Alive && m.Meta.Raft != "" && (!known || s.Address != m.Meta.Raft):
			if known { // same name, new address (a container restarted): re-add
				if err := c.n.cat.RemoveServer(m.Name); err != nil {
					return err
				}
				if s.Voter {
					voters--
				}
			}
			voter := voters < maxVoters
			if err := c.n.cat.AddServer(m.Name, m.Meta.Raft, voter); err != nil {
				return fmt.Errorf("adding %s: %w", m.Name, err)
			}
			if voter {
				voters++
			}
			c.n.log.Info("raft member added", "member", m.Name, "voter", voter)
		case known && (m.State == membership.Dead || m.State == membership.Left) && m.Name != c.n.cfg.Name &&
			time.Since(m.Since) > c.n.cfg.DeadGrace:
			if err := c.n.cat.RemoveServer(m.Name); err != nil {
				return err
			}
			c.n.log.Info("raft member removed", "member", m.Name, "state", m.State)
		}
	}
	return nil
}

func (c *cluster) peerAddr(name string) (string, bool) {
	m, ok := c.ml.Get(name)
	if !ok || m.State != membership.Alive || m.Meta.Peer == "" {
		return "", false
	}
	return m.Meta.Peer, true
}

// fromOwner fetches an item from its owner's memory (the owner fills it from
// storage once if needed). ok=false means fall back to storage.
func (c *cluster) fromOwner(ctx context.Context, owner string, d *catalog.Dataset, index int) (filled, bool) {
	addr, ok := c.peerAddr(owner)
	if !ok {
		c.n.counters.peerFailures.Add(1)
		return filled{}, false
	}
	// The owner may itself read storage, so allow it that time on top of the
	// bound for a hung peer.
	pctx, cancel := context.WithTimeout(ctx, c.n.cfg.PeerTimeout)
	defer cancel()
	res, err := c.client.Get(pctx, addr, &transport.Request{Dataset: d.Name, DatasetVersion: d.Version,
		Indices: []uint32{uint32(index)}, Ring: c.ring().Version()})
	if err != nil || !res[0].Found {
		c.n.counters.peerFailures.Add(1)
		c.n.log.Debug("peer fetch failed; reading storage", "owner", owner, "err", err)
		return filled{}, false
	}
	c.n.counters.peerBytesIn.Add(uint64(len(res[0].Data)))
	return filled{data: res[0].Data, sum: res[0].Sum, cache: Peer, recycle: res[0].Recycle}, true
}

// handoff asks the item's previous owner for it after a ring change, so that
// ownership moves do not turn into storage reads. It never reads storage.
func (c *cluster) handoff(ctx context.Context, d *catalog.Dataset, index int) (filled, bool) {
	if c == nil {
		return filled{}, false
	}
	rp := c.rings.Load()
	key := d.Manifest.Key(index)
	tried := map[string]bool{c.n.cfg.Name: true}
	for _, r := range []*partition.Ring{rp.withoutSelf, rp.prev} {
		if r == nil || r.Empty() {
			continue
		}
		prev := r.Owner(d.Name, key)
		if tried[prev] {
			continue
		}
		tried[prev] = true
		if f, ok := c.handoffFrom(ctx, prev, rp.cur.Version(), d, index); ok {
			return f, true
		}
	}
	return filled{}, false
}

func (c *cluster) handoffFrom(ctx context.Context, prev string, ring uint64, d *catalog.Dataset, index int) (filled, bool) {
	addr, ok := c.peerAddr(prev)
	if !ok {
		return filled{}, false
	}
	pctx, cancel := context.WithTimeout(ctx, c.n.cfg.PeerTimeout)
	defer cancel()
	res, err := c.client.Get(pctx, addr, &transport.Request{Dataset: d.Name, DatasetVersion: d.Version,
		Indices: []uint32{uint32(index)}, Ring: ring, Handoff: true})
	if err != nil || !res[0].Found {
		return filled{}, false
	}
	k := store.MakeKey(d.ID, uint32(index))
	if err := c.n.store.Put(k, res[0].Data, res[0].Sum); err != nil && !errors.Is(err, store.ErrNotAdmitted) {
		return filled{}, false
	}
	c.n.counters.peerBytesIn.Add(uint64(len(res[0].Data)))
	return filled{data: res[0].Data, sum: res[0].Sum, cache: Peer, recycle: res[0].Recycle}, true
}

// batchFromOwners fetches the missing positions of out that other members own,
// one transport request per owner, and returns the positions still missing.
func (c *cluster) batchFromOwners(ctx context.Context, d *catalog.Dataset, indices, missing []int, out []Item) []int {
	byOwner := map[string][]int{}
	var left []int
	for _, j := range missing {
		owner, self := c.n.owner(d, indices[j])
		if self {
			left = append(left, j)
			continue
		}
		byOwner[owner] = append(byOwner[owner], j)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for owner, pos := range byOwner {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got := c.batchFromOwner(ctx, owner, d, indices, pos, out)
			if len(got) > 0 {
				mu.Lock()
				left = append(left, got...)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return left
}

func (c *cluster) batchFromOwner(ctx context.Context, owner string, d *catalog.Dataset, indices, pos []int, out []Item) []int {
	addr, ok := c.peerAddr(owner)
	if !ok {
		return pos
	}
	req := &transport.Request{Dataset: d.Name, DatasetVersion: d.Version, Ring: c.ring().Version()}
	for _, j := range pos {
		req.Indices = append(req.Indices, uint32(indices[j]))
	}
	pctx, cancel := context.WithTimeout(ctx, c.n.cfg.PeerTimeout+time.Duration(len(pos))*50*time.Millisecond)
	defer cancel()
	res, err := c.client.Get(pctx, addr, req)
	if err != nil {
		c.n.counters.peerFailures.Add(1)
		return pos
	}
	var left []int
	for x, j := range pos {
		if !res[x].Found {
			left = append(left, j)
			continue
		}
		c.n.counters.hitsPeer.Add(1)
		c.n.counters.peerBytesIn.Add(uint64(len(res[x].Data)))
		out[j] = Item{Key: d.Manifest.Key(indices[j]), Data: res[x].Data, Sum: res[x].Sum, Cache: Peer}
	}
	return left
}

// servePeer answers another node. It never forwards: what this node holds is
// served from memory, anything else is read from storage here (and cached only
// if this node owns it), so no request can bounce between nodes.
func (c *cluster) servePeer(ctx context.Context, req *transport.Request) (_ []transport.Item, err error) {
	n := c.n
	// The asker may have applied a registration this node has not yet: wait a
	// moment for the catalog to catch up rather than fail the fetch.
	d, ok := n.cat.Dataset(req.Dataset)
	if req.Inline && (!ok || d.Version != req.DatasetVersion) {
		return nil, transport.ErrWouldBlock
	}
	if !ok || d.Version < req.DatasetVersion {
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		n.cat.WaitFor(wctx, func() bool {
			d, ok = n.cat.Dataset(req.Dataset)
			return ok && d.Version >= req.DatasetVersion
		})
		cancel()
	}
	if !ok {
		return nil, fmt.Errorf("no dataset %q", req.Dataset)
	}
	if d.Version != req.DatasetVersion {
		return nil, fmt.Errorf("dataset %s is at version %d here, %d there", d.Name, d.Version, req.DatasetVersion)
	}
	if req.Handoff && req.Ring != c.ring().Version() {
		// The new owner sees a membership this node has not caught up with.
		// Deciding under the stale ring whether to let the items go could
		// leave them held twice.
		if req.Inline {
			return nil, transport.ErrWouldBlock
		}
		c.awaitRing(ctx, req.Ring)
	}
	items := make([]transport.Item, len(req.Indices))
	// What to undo when the answer fails part-way: the pins and buffers of the
	// items gathered so far (without a handoff's delete, as nothing was sent).
	undo := make([]func(), len(req.Indices))
	defer func() {
		if err != nil {
			for _, f := range undo {
				if f != nil {
					f()
				}
			}
		}
	}()
	if req.Inline {
		// Only when every item is resident; observed once, on the call
		// that answers.
		for j, i := range req.Indices {
			ref, ok := store.Ref{}, false
			if int(i) < d.Manifest.Len() {
				ref, ok = n.store.Get(store.MakeKey(d.ID, i))
			}
			if !ok {
				return nil, transport.ErrWouldBlock
			}
			items[j] = transport.Item{Data: ref.Data, Sum: ref.Sum, Found: true, Release: ref.Release}
			undo[j] = ref.Release
		}
	}
	for j, i := range req.Indices {
		if int(i) >= d.Manifest.Len() {
			return nil, fmt.Errorf("index %d out of range", i)
		}
		k := store.MakeKey(d.ID, i)
		if !req.Handoff {
			n.observe(d.ID, int(i), "")
		}
		if !items[j].Found { // not pinned by the inline pass
			if ref, ok := n.store.Get(k); ok {
				items[j] = transport.Item{Data: ref.Data, Sum: ref.Sum, Found: true, Release: ref.Release}
				undo[j] = ref.Release
			}
		}
		if it := items[j]; it.Found {
			if req.Handoff {
				if _, self := n.owner(d, int(i)); !self {
					// The asker owns it now: after sending, let it go, so
					// the cluster keeps holding each item once.
					items[j].Release = func() { it.Release(); n.store.Delete(k) }
				}
			}
			n.counters.peerBytesOut.Add(uint64(len(it.Data)))
			continue
		}
		if req.Handoff {
			continue
		}
		f, err := n.fetchForPeer(ctx, d, int(i))
		if err != nil {
			return nil, err
		}
		if xxhash.Sum64(f.data) != f.sum {
			return nil, errors.New("checksum mismatch after fill")
		}
		items[j] = transport.Item{Data: f.data, Sum: f.sum, Found: true, Release: f.recycle}
		undo[j] = f.recycle
		n.counters.peerBytesOut.Add(uint64(len(f.data)))
	}
	return items, nil
}

// awaitRing waits, briefly, until this node's ring is the one a peer reports.
func (c *cluster) awaitRing(ctx context.Context, version uint64) {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for c.rebuildRing(); c.ring().Version() != version; c.rebuildRing() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Cluster describes the members this node knows, with each alive member's
// cache figures fetched from its own /v1/stats.
func (n *Node) Cluster() api.Cluster {
	st := n.Stats()
	self := api.Member{Name: n.cfg.Name, HTTP: n.cfg.HTTPAdvert, Peer: n.cfg.PeerAdvert, State: "alive",
		Items: st.ItemsCached, Bytes: st.BytesCached, Capacity: st.CapacityBytes, Share: 1}
	info := api.Cluster{Self: n.cfg.Name, Leader: n.cat.Leader()}
	if n.cl == nil {
		info.Members = []api.Member{self}
		return info
	}
	shares := n.cl.ring().Shares()
	self.Share = shares[n.cfg.Name]
	members := n.cl.ml.Members()
	info.Members = make([]api.Member, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		if m.Name == n.cfg.Name {
			info.Members[i] = self
			continue
		}
		info.Members[i] = api.Member{Name: m.Name, HTTP: m.Meta.HTTP, Peer: m.Meta.Peer, State: string(m.State),
			Capacity: m.Meta.Capacity, Share: shares[m.Name]}
		if m.State != membership.Alive && m.State != membership.Suspect {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			n.cl.fillRemoteStats(&info.Members[i])
		}()
	}
	wg.Wait()
	if servers, err := n.cat.Servers(); err == nil {
		role := map[string]string{}
		for _, sv := range servers {
			role[sv.ID] = map[bool]string{true: "voter", false: "nonvoter"}[sv.Voter]
		}
		for i := range info.Members {
			info.Members[i].Raft = role[info.Members[i].Name]
		}
	}
	return info
}

func (c *cluster) fillRemoteStats(m *api.Member) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + m.HTTP + "/metrics")
	if err := c.http.DoTimeout(req, resp, 500*time.Millisecond); err != nil || resp.StatusCode() != 200 {
		return
	}
	m.Items = int(metricValue(resp.Body(), "stallfree_items_cached"))
	m.Bytes = uint64(metricValue(resp.Body(), "stallfree_bytes_cached"))
}

// LeaderHTTP is the raft leader's HTTP address, or "" when unknown.
func (n *Node) LeaderHTTP() string {
	leader := n.cat.Leader()
	if leader == "" {
		return ""
	}
	if leader == n.cfg.Name {
		return n.cfg.HTTPAdvert
	}
	if n.cl == nil {
		return ""
	}
	m, ok := n.cl.ml.Get(leader)
	if !ok {
		return ""
	}
	return m.Meta.HTTP
}
