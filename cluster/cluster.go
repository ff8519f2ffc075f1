// Package cluster is the part of a node that exists only with peers: gossip
// membership, the consistent-hash ring over the live members, the peer
// transport in both directions (fetching from owners, serving peers, handing
// items over when ownership moves) and keeping raft's voter set in line with
// the members. It reaches back into the node only through Local.
package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"stallfree/catalog"
	"stallfree/clusterauth"
	"stallfree/discovery"
	"stallfree/listen"
	"stallfree/membership"
	"stallfree/partition"
	"stallfree/store"
	"stallfree/transport"
)

// maxVoters: raft stays fast with a small quorum; members beyond it follow
// the catalog as non-voters.
const maxVoters = 5

// Fill is an item's bytes as fetched from a peer or read for one.
type Fill struct {
	Data []byte
	Sum  uint64
	// Recycle, when set, hands Data's buffer back for reuse; only the
	// item's sole user may call it, once it is done with Data.
	Recycle func()
}

// Local is what the cluster needs from the node it belongs to.
type Local interface {
	// FillForPeer fills an item a peer asked for: from this node's previous
	// owner or storage, once, cached only if this node owns it. It must
	// never ask another owner, so no request bounces between nodes.
	FillForPeer(ctx context.Context, d *catalog.Dataset, index int) (Fill, error)
	// Observe tells the node's cache policy that an item was asked for.
	Observe(dataset uint32, index int)
}

// Config says how this node takes part in the cluster.
type Config struct {
	Name       string
	GossipBind string
	Advertise  string // IP others use to reach this node
	Join       []string
	PeerBind   string
	ClusterKey []byte // raw --cluster-key-file contents; empty = no encryption or authentication
	// What this node tells the others about itself.
	HTTPAdvert, PeerAdvert, RaftAdvert string
	Capacity                           uint64
	PeerTimeout                        time.Duration // bound on a peer fetch before falling back to storage
	// DeadGrace is how long a dead member stays in the raft configuration
	// (0: Timing's).
	DeadGrace time.Duration
	Logger    *slog.Logger
	// Timing is how fast this node gossips, vouches for members and lets
	// the dead go: LANTiming (the zero Timing means it) or LocalTiming.
	Timing Timing
	// MaxPeerConns bounds the peer connections this node accepts at once.
	MaxPeerConns int
	// Resolver looks up host names among the Join seeds (nil: the system's).
	Resolver discovery.Resolver
}

// Timing is a cluster timing profile.
type Timing struct {
	// Gossip is membership's profile.
	Gossip membership.Timing
	// DeadGrace is how long a dead member stays in the raft configuration
	// when Config.DeadGrace does not say.
	DeadGrace time.Duration
	// PingTimeout bounds the direct ping with which this node checks a
	// member gossip calls dead before it vouches for it (vouch.go), and
	// HoldMax how long it keeps such a member on its ring.
	PingTimeout, HoldMax time.Duration
}

// LANTiming is for hosts on one network.
func LANTiming() Timing {
	return Timing{Gossip: membership.LANTiming(), DeadGrace: time.Minute, PingTimeout: time.Second, HoldMax: 10 * time.Second}
}

// LocalTiming is for members on one host (loopback tests and demos).
func LocalTiming() Timing {
	return Timing{Gossip: membership.LocalTiming(), DeadGrace: 5 * time.Second, PingTimeout: 300 * time.Millisecond,
		HoldMax: 3 * time.Second}
}

// DefaultLANConfig is a Config with LANTiming; the caller fills in the rest.
func DefaultLANConfig() Config { return Config{Timing: LANTiming()} }

// DefaultLocalConfig is a Config with LocalTiming; the caller fills in the
// rest.
func DefaultLocalConfig() Config { return Config{Timing: LocalTiming()} }

// Stats are the cluster's cumulative figures.
type Stats struct {
	PeerBytesIn, PeerBytesOut, PeerFailures uint64
	// RingChanges counts the rings this node has rebuilt since it started:
	// a member flapping under load shows here, and moves items each time.
	RingChanges uint64
	// MembersVouched counts the members gossip declared dead that answered
	// this node directly and so stayed on its ring (vouch.go).
	MembersVouched uint64
	// Members counts the members gossip knows by state (alive, suspect,
	// dead, left), this node included.
	Members map[string]int
}

// Cluster is safe for concurrent use.
type Cluster struct {
	cfg    Config
	log    *slog.Logger
	local  Local
	cat    *catalog.Catalog
	store  *store.Store
	ml     *membership.Membership
	srv    *transport.Server
	client *transport.Client
	rings  atomic.Pointer[ringPair]
	// ringMissed is the last peer ring version awaitRing gave up on;
	// ringWaits counts the waits it began.
	ringMissed, ringWaits atomic.Uint64
	ringMu                sync.Mutex // one rebuild at a time, so prev is always the ring replaced
	wg                    sync.WaitGroup
	stop                  chan struct{}
	leaveOnce             sync.Once // gossip is left once, by Leave or Close

	peerBytesIn, peerBytesOut, peerFailures atomic.Uint64
	ringChanges                             atomic.Uint64
	vouch                                   *voucher
	recheck                                 chan struct{} // a voucher's verdict: rebuild the ring
}

// ringPair keeps the rings a new owner consults to find who held an item
// before it, so ownership moves become transfers instead of storage reads:
// the previous ring (any membership change) and the current ring without this
// node (a join or rejoin: exactly the ring under which the items were filled).
type ringPair struct{ cur, prev, withoutSelf *partition.Ring }

// New prepares this node's part in the cluster; Start joins it. The split
// lets the node keep the *Cluster before any peer request can reach it.
func New(cfg Config, local Local, cat *catalog.Catalog, st *store.Store) *Cluster {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.PeerTimeout == 0 {
		cfg.PeerTimeout = 2 * time.Second
	}
	if cfg.Timing == (Timing{}) {
		cfg.Timing = LANTiming()
	}
	if cfg.DeadGrace == 0 {
		cfg.DeadGrace = cfg.Timing.DeadGrace
	}
	c := &Cluster{cfg: cfg, log: cfg.Logger, local: local, cat: cat, store: st,
		client: transport.NewClient(clusterauth.Derive(cfg.ClusterKey, "transport")), stop: make(chan struct{})}
	empty, _ := partition.New(nil)
	c.rings.Store(&ringPair{cur: empty})
	c.recheck = make(chan struct{}, 1)
	kick := func() {
		select {
		case c.recheck <- struct{}{}:
		default:
		}
	}
	t := cfg.Timing
	c.vouch = newVoucher(c.client.Ping, t.PingTimeout, t.PingTimeout, t.HoldMax, kick, c.log)
	return c
}

// Start binds the peer transport, joins gossip and starts following
// membership. After an error, nothing is left running.
func (c *Cluster) Start() error {
	cfg := c.cfg
	ln, err := net.Listen("tcp", cfg.PeerBind)
	if err != nil {
		return fmt.Errorf("--peer: %w", err)
	}
	ln = listen.Guard(ln, listen.Options{Name: "peer", MaxConns: cfg.MaxPeerConns, Log: c.log})
	c.srv = transport.NewServer(clusterauth.Derive(cfg.ClusterKey, "transport"), c.servePeer, c.log.With("component", "transport"))
	c.srv.Figures = c.figures
	go c.srv.Serve(ln)

	raftAdv := cfg.RaftAdvert
	ml, err := membership.Join(membership.Config{
		Name: cfg.Name, Bind: cfg.GossipBind, Advertise: cfg.Advertise, Join: cfg.Join, Resolver: cfg.Resolver,
		SecretKey: clusterauth.Derive(cfg.ClusterKey, "gossip"), Timing: cfg.Timing.Gossip, Logger: c.log,
		Meta: membership.Meta{Incarnation: time.Now().UnixNano(), HTTP: cfg.HTTPAdvert, Peer: cfg.PeerAdvert,
			Raft: raftAdv, Capacity: cfg.Capacity},
	})
	if err != nil {
		c.srv.Close()
		c.client.Close()
		return err
	}
	c.ml = ml
	c.rebuildRing()
	c.wg.Add(1)
	go c.watch()
	return nil
}

// Close leaves gossip and stops the transport.
func (c *Cluster) Close() {
	close(c.stop)
	c.wg.Wait()
	c.vouch.close()
	c.leaveGossip()
	c.srv.Close()
	c.client.Close()
}

// Stats returns the cluster's counters.
func (c *Cluster) Stats() Stats {
	st := Stats{PeerBytesIn: c.peerBytesIn.Load(), PeerBytesOut: c.peerBytesOut.Load(), PeerFailures: c.peerFailures.Load(),
		RingChanges: c.ringChanges.Load(), MembersVouched: c.vouch.vouched.Load(), Members: map[string]int{}}
	for _, m := range c.ml.Members() {
		st.Members[string(m.State)]++
	}
	return st
}

func (c *Cluster) ring() *partition.Ring { return c.rings.Load().cur }

// Ring is the ring owners are computed on now (empty before the first
// members are seen: this node owns everything then).
func (c *Cluster) Ring() *partition.Ring { return c.ring() }

// Owner returns the member owning item index of d and whether that is this
// node (an empty ring makes every item this node's).
func (c *Cluster) Owner(d *catalog.Dataset, index int) (string, bool) {
	o := c.ring().Owner(d.RingName(), d.Manifest.OwnerKey(index))
	return o, o == "" || o == c.cfg.Name
}

// Joined reports whether this node has found the cluster: it sees another
// member, or it was given no one to join.
func (c *Cluster) Joined() bool { return len(c.cfg.Join) == 0 || len(c.ml.Alive()) > 1 }

// Members are the live members the ring is built over.
func (c *Cluster) Members() []string { return c.ring().Members() }

// HTTPAddr is a member's advertised HTTP address.
func (c *Cluster) HTTPAddr(name string) (string, bool) {
	m, ok := c.ml.Get(name)
	if !ok || m.Meta.HTTP == "" {
		return "", false
	}
	return m.Meta.HTTP, true
}

// rebuildRing recomputes ownership over the alive members, and the dead ones
// that still answer (vouch.go).
func (c *Cluster) rebuildRing() {
	c.ringMu.Lock()
	defer c.ringMu.Unlock()
	old := c.rings.Load()
	alive := c.ringMembers(old.cur)
	if slices.Equal(old.cur.Members(), alive) {
		return
	}
	r, err := partition.New(alive)
	if err != nil {
		c.log.Error("ring not rebuilt", "members", alive, "err", err)
		return
	}
	others := slices.DeleteFunc(slices.Clone(alive), func(m string) bool { return m == c.cfg.Name })
	without, err := partition.New(others)
	if err != nil {
		without = nil
	}
	c.rings.Store(&ringPair{cur: r, prev: old.cur, withoutSelf: without})
	c.ringChanges.Add(1)
	c.log.Info("ring", "members", alive, "version", r.Version(), "moved", partition.Moved(old.cur, r))
	// Connections to members that left are of no further use.
	for _, m := range c.ml.Members() {
		if (m.State == membership.Dead || m.State == membership.Left) && !slices.Contains(alive, m.Name) {
			c.client.Forget(m.Meta.Peer)
		}
	}
}

// ringMembers are the members gossip sees alive, plus those on the ring cur
// that gossip declared dead (not left) but that the voucher keeps.
func (c *Cluster) ringMembers(cur *partition.Ring) []string {
	alive := c.ml.Alive() // sorted
	var deadOnRing map[string]bool
	for _, name := range cur.Members() {
		if _, found := slices.BinarySearch(alive, name); found {
			continue
		}
		m, ok := c.ml.Get(name)
		if !ok || m.State != membership.Dead {
			continue
		}
		if deadOnRing == nil {
			deadOnRing = map[string]bool{}
		}
		deadOnRing[name] = true
		if c.vouch.keep(name, m.Meta.Peer) {
			alive = append(alive, name)
		}
	}
	c.vouch.prune(deadOnRing)
	slices.Sort(alive)
	return alive
}

// watch follows membership: it rebuilds the ring on every change, and on the
// raft leader keeps the voter set in line with the live members.
func (c *Cluster) watch() {
	defer c.wg.Done()
	kick := make(chan struct{}, 1)
	c.wg.Add(1)
	go c.upkeepRaft(kick)
	for {
		select {
		case <-c.stop:
			return
		case <-c.recheck:
			c.rebuildRing()
		case <-c.ml.Changed():
			c.rebuildRing()
			select {
			case kick <- struct{}{}:
			default:
			}
		}
	}
}

// awaitRing waits, briefly, until this node's ring is the one a peer reports.
// A version already waited for in vain is not waited for again: while
// members are still joining, views can differ for seconds, and a second's
// wait per handoff held a 24-node warm-up to 8 items/s (8 workers, one
// second each). Callers then act on their own ring (a handoff finds nothing,
// a push is refused), which costs a storage read, not a stall.
func (c *Cluster) awaitRing(ctx context.Context, version uint64) {
	c.rebuildRing()
	if c.ring().Version() == version || c.ringMissed.Load() == version {
		return
	}
	c.ringWaits.Add(1)
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for c.rebuildRing(); c.ring().Version() != version; c.rebuildRing() {
		select {
		case <-ctx.Done():
			c.ringMissed.Store(version)
			return
		case <-t.C:
		}
	}
}
