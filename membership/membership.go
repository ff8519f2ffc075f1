// Package membership tracks the cluster's live nodes with hashicorp/memberlist
// gossip. Each node advertises its addresses and capacity in its metadata.
package membership

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/vmihailenco/msgpack/v5"

	"stallfree/discovery"
	"stallfree/logbridge"
)

// Meta is what a node tells the others about itself (msgpack, well under
// memberlist's 512-byte limit).
type Meta struct {
	Incarnation int64  `msgpack:"i"` // process start time: tells a restart from the old process
	HTTP        string `msgpack:"h"`
	Peer        string `msgpack:"p"`
	Raft        string `msgpack:"r"`
	Capacity    uint64 `msgpack:"c"`
}

// State of a member as reported by /v1/cluster.
type State string

// Member states.
const (
	Alive   State = "alive"
	Suspect State = "suspect"
	Dead    State = "dead"
	Left    State = "left"
)

// Member is one node as this node sees it.
type Member struct {
	Name  string
	Addr  string // gossip address
	State State
	Meta  Meta
	Since time.Time // when the state was last seen to change
}

// Config configures gossip.
type Config struct {
	Name      string
	Bind      string // host:port for gossip (UDP and TCP)
	Advertise string // IP others use; required when Bind is unspecified
	Join      []string
	SecretKey []byte // 16, 24 or 32 bytes: AES-GCM on all gossip
	Meta      Meta
	Logger    *slog.Logger
	// Timing is how fast gossip probes, suspects and spreads: LANTiming (the
	// zero Timing means it) or LocalTiming.
	Timing Timing
	// Resolver looks up the host names among the Join seeds (host:port),
	// again on every attempt; a name joins every address it resolves to.
	// nil: the system's resolver.
	Resolver discovery.Resolver
}

// Timing is a gossip timing profile: memberlist's own, with what this
// project changes in it. Each field is memberlist.Config's of that name but
// RejoinInterval.
type Timing struct {
	ProbeInterval       time.Duration
	ProbeTimeout        time.Duration
	SuspicionMult       int
	GossipInterval      time.Duration
	PushPullInterval    time.Duration
	GossipToTheDeadTime time.Duration
	TCPTimeout          time.Duration
	IndirectChecks      int
	RetransmitMult      int
	// RejoinInterval re-contacts seeds and lost members so a cluster heals
	// after a partition longer than memberlist remembers the dead.
	RejoinInterval time.Duration
}

func timingOf(mc *memberlist.Config, rejoin time.Duration) Timing {
	return Timing{ProbeInterval: mc.ProbeInterval, ProbeTimeout: mc.ProbeTimeout, SuspicionMult: mc.SuspicionMult,
		GossipInterval: mc.GossipInterval, PushPullInterval: mc.PushPullInterval, GossipToTheDeadTime: mc.GossipToTheDeadTime,
		TCPTimeout: mc.TCPTimeout, IndirectChecks: mc.IndirectChecks, RetransmitMult: mc.RetransmitMult, RejoinInterval: rejoin}
}

// LANTiming is memberlist's DefaultLANConfig, probing faster. A training
// cluster is one LAN of at most a few hundred hosts, and a host lost is a
// rank stalled on peer timeouts until the ring moves: probe twice as often
// as memberlist's LAN default and suspect for 3·log10(n) probe intervals
// instead of 4 (measured on the 32-host testbed: dead everywhere in ~5 s
// instead of 11-17 s; docs/hosts.md). Lifeguard's local health still
// stretches both on a slow node.
func LANTiming() Timing {
	t := timingOf(memberlist.DefaultLANConfig(), 10*time.Second)
	t.ProbeInterval, t.ProbeTimeout, t.SuspicionMult = 500*time.Millisecond, 300*time.Millisecond, 3
	return t
}

// LocalTiming is memberlist's DefaultLocalConfig, faster still: members on
// one host (loopback tests and demos) see a stopped member dead within about
// a second.
func LocalTiming() Timing {
	t := timingOf(memberlist.DefaultLocalConfig(), time.Second)
	t.ProbeInterval, t.ProbeTimeout, t.SuspicionMult = 200*time.Millisecond, 100*time.Millisecond, 2
	t.GossipInterval, t.PushPullInterval, t.GossipToTheDeadTime = 50*time.Millisecond, 2*time.Second, 5*time.Second
	return t
}

// DefaultLANConfig is a Config with LANTiming; the caller fills in the rest.
func DefaultLANConfig() Config { return Config{Timing: LANTiming()} }

// DefaultLocalConfig is a Config with LocalTiming; the caller fills in the
// rest.
func DefaultLocalConfig() Config { return Config{Timing: LocalTiming()} }

// apply sets t's fields in mc.
func (t Timing) apply(mc *memberlist.Config) {
	mc.ProbeInterval, mc.ProbeTimeout, mc.SuspicionMult = t.ProbeInterval, t.ProbeTimeout, t.SuspicionMult
	mc.GossipInterval, mc.PushPullInterval, mc.GossipToTheDeadTime = t.GossipInterval, t.PushPullInterval, t.GossipToTheDeadTime
	mc.TCPTimeout, mc.IndirectChecks, mc.RetransmitMult = t.TCPTimeout, t.IndirectChecks, t.RetransmitMult
}

// Membership is safe for concurrent use.
type Membership struct {
	ml      *memberlist.Memberlist
	cfg     Config
	log     *slog.Logger
	mu      sync.Mutex
	members map[string]*Member
	changed chan struct{}
	stop    chan struct{}
	wg      sync.WaitGroup
	// self is this node's gossip address as the others dial it.
	self string
	// leaving holds members that said goodbye and have not gone yet.
	// memberlist's leave event does not tell a leave from a failure (the
	// Node it hands over never carries StateLeft), so a leaving node tells
	// every member itself, over memberlist's encrypted TCP, before it goes.
	leaving map[string]bool
}

// Join starts gossip and contacts the seeds (failing to reach them is not
// fatal: the rejoin loop keeps trying).
func Join(cfg Config) (*Membership, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	host, portStr, err := net.SplitHostPort(cfg.Bind)
	if err != nil {
		return nil, fmt.Errorf("membership: --gossip %q: %w", cfg.Bind, err)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return nil, fmt.Errorf("membership: --gossip port %q: %w", portStr, err)
	}
	if cfg.Timing == (Timing{}) {
		cfg.Timing = LANTiming()
	}
	if cfg.Timing.RejoinInterval <= 0 {
		cfg.Timing.RejoinInterval = LANTiming().RejoinInterval
	}
	mc := memberlist.DefaultLANConfig()
	cfg.Timing.apply(mc)
	mc.Name = cfg.Name
	mc.BindAddr, mc.BindPort = host, port
	adv := cfg.Advertise
	if adv == "" {
		adv = host
	}
	if ip := net.ParseIP(adv); ip == nil || ip.IsUnspecified() {
		return nil, fmt.Errorf("membership: advertise address %q must be an IP (set --advertise)", adv)
	}
	mc.AdvertiseAddr, mc.AdvertisePort = adv, port
	mc.SecretKey = cfg.SecretKey
	// A node restarted in a container gets a new IP under the same name.
	mc.DeadNodeReclaimTime = 10 * time.Second
	mc.Logger = logbridge.Memberlist(cfg.Logger)
	tr, err := newStreamTransport(host, port, len(cfg.SecretKey) > 0, mc.Logger, cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("membership: binding --gossip %s: %w", cfg.Bind, err)
	}
	if port == 0 { // bound to a port of the kernel's choice: that one is advertised
		port = tr.GetAutoBindPort()
		portStr = strconv.Itoa(port)
		mc.BindPort, mc.AdvertisePort = port, port
	}
	mc.Transport = tr
	m := &Membership{cfg: cfg, log: cfg.Logger, members: map[string]*Member{}, leaving: map[string]bool{}, changed: make(chan struct{}, 1), stop: make(chan struct{})}
	m.self = net.JoinHostPort(net.ParseIP(adv).String(), portStr)
	mc.Delegate = delegate{m}
	mc.Events = events{m}
	ml, err := memberlist.Create(mc)
	if err != nil {
		tr.Shutdown()
		return nil, fmt.Errorf("membership: %w", err)
	}
	m.ml = ml
	seeds, err := m.seeds()
	if err != nil {
		// Usual while a headless Service has no pods yet; lasting, a typo.
		m.log.Warn("resolving --join; will retry", "err", err)
	}
	if len(seeds) > 0 {
		if _, err := ml.Join(seeds); err != nil {
			// Seeds started a moment later are the rule when a cluster starts
			// together: the rejoin loop retries every second, and warns once
			// the node has been alone for longer than a start takes.
			m.log.Info("seeds not reachable yet; retrying", "seeds", seeds, "err", err)
		}
	}
	m.wg.Add(1)
	go m.rejoinLoop()
	return m, nil
}

// Leave tells the cluster this node is going and stops gossip.
func (m *Membership) Leave(timeout time.Duration) error {
	close(m.stop)
	m.wg.Wait()
	m.sayGoodbye(timeout)
	err := m.ml.Leave(timeout)
	if serr := m.ml.Shutdown(); err == nil {
		err = serr
	}
	return err
}

// Changed is signalled (coalesced) whenever a member joins, leaves, fails or
// updates its metadata.
func (m *Membership) Changed() <-chan struct{} { return m.changed }

// Name is the local node's name.
func (m *Membership) Name() string { return m.cfg.Name }

// Members returns every known member, alive or not, sorted by name.
// memberlist keeps its suspicion of a member to itself (the public Node's
// State stays what it was at the last alive/dead event), so a member is
// alive here until gossip declares it dead; the failure detector's timers in
// Join are set so that takes a few seconds.
func (m *Membership) Members() []Member {
	m.mu.Lock()
	out := make([]Member, 0, len(m.members))
	for _, mem := range m.members {
		out = append(out, *mem)
	}
	m.mu.Unlock()
	slices.SortFunc(out, func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// Alive returns the names of members gossip considers alive (suspects
// included: they own items until declared dead, and callers fall back on
// their own when a fetch times out).
func (m *Membership) Alive() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, mem := range m.members {
		if mem.State == Alive {
			out = append(out, mem.Name)
		}
	}
	slices.Sort(out)
	return out
}

// Get returns a member by name.
func (m *Membership) Get(name string) (Member, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	mem, ok := m.members[name]
	if !ok {
		return Member{}, false
	}
	return *mem, true
}

func (m *Membership) notify() {
	select {
	case m.changed <- struct{}{}:
	default:
	}
}

// goodbye prefixes the message a leaving node sends every member.
const goodbye = "stallfree-leaving:"

// sayGoodbye tells every member, directly and reliably, that this node is
// leaving. Best effort within timeout: a member that does not hear it sees a
// failure instead, which costs it a few rejoin attempts, nothing more.
func (m *Membership) sayGoodbye(timeout time.Duration) {
	msg := []byte(goodbye + m.cfg.Name)
	// Copies of the members, not memberlist's own Nodes: gossip rewrites
	// those under its lock while these sends read them.
	var to []*memberlist.Node
	m.mu.Lock()
	for _, mem := range m.members {
		host, port, err := net.SplitHostPort(mem.Addr)
		p, perr := strconv.Atoi(port)
		if mem.Name == m.cfg.Name || mem.State != Alive || err != nil || perr != nil {
			continue
		}
		to = append(to, &memberlist.Node{Name: mem.Name, Addr: net.ParseIP(host), Port: uint16(p)})
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, n := range to {
		wg.Go(func() {
			if err := m.ml.SendReliable(n, msg); err != nil {
				m.log.Debug("saying goodbye", "member", n.Name, "err", err)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(timeout):
	}
}

func (m *Membership) update(n *memberlist.Node, st State) {
	var meta Meta
	if err := msgpack.Unmarshal(n.Meta, &meta); err != nil && len(n.Meta) > 0 {
		m.log.Warn("ignoring member with unreadable metadata", "member", n.Name, "err", err)
		return
	}
	m.mu.Lock()
	old, ok := m.members[n.Name]
	if !ok || old.State != st || old.Meta != meta {
		m.members[n.Name] = &Member{Name: n.Name, Addr: n.Address(), State: st, Meta: meta, Since: time.Now()}
	}
	m.mu.Unlock()
	m.notify()
}

// aloneWarning is how long a node with seeds may stay alone before it warns:
// longer than a cluster started together takes to find itself.
const aloneWarning = 30 * time.Second

// rejoinLoop re-contacts seeds and every member once seen but now missing.
// Bare memberlist forgets the other side of a long partition for good.
func (m *Membership) rejoinLoop() {
	defer m.wg.Done()
	// A node that has no one yet (its seeds were not up when it started)
	// retries every second; one that has peers re-contacts lost ones at the
	// configured interval.
	t := time.NewTicker(min(time.Second, m.cfg.Timing.RejoinInterval))
	defer t.Stop()
	last := time.Now()
	aloneSince, warned := time.Now(), false
	for {
		select {
		case <-m.stop:
			return
		case <-t.C:
		}
		if len(m.cfg.Join) > 0 && m.ml.NumMembers() <= 1 {
			if !warned && time.Since(aloneSince) > aloneWarning {
				m.log.Warn("no seed has answered; still alone, retrying", "seeds", m.cfg.Join, "for", time.Since(aloneSince).Round(time.Second))
				warned = true
			}
		} else {
			aloneSince, warned = time.Now(), false
		}
		if m.ml.NumMembers() > 1 && time.Since(last) < m.cfg.Timing.RejoinInterval {
			continue
		}
		last = time.Now()
		// From this package's own view: the Nodes memberlist hands out are
		// its live state, written under its lock, so reading their
		// addresses here would race with gossip.
		alive := map[string]bool{m.self: true}
		m.mu.Lock()
		for _, mem := range m.members {
			if mem.State == Alive {
				alive[mem.Addr] = true
			}
		}
		m.mu.Unlock()
		seeds, err := m.seeds()
		if err != nil {
			m.log.Debug("resolving --join", "err", err)
		}
		var targets []string
		for _, s := range seeds {
			if !alive[s] {
				targets = append(targets, s)
			}
		}
		m.mu.Lock()
		for _, mem := range m.members {
			if mem.State != Alive && mem.State != Left && !alive[mem.Addr] && !slices.Contains(targets, mem.Addr) {
				targets = append(targets, mem.Addr)
			}
		}
		m.mu.Unlock()
		if len(targets) > 0 {
			if n, err := m.ml.Join(targets); err == nil && n > 0 {
				m.log.Debug("rejoined", "contacted", n)
			}
		}
	}
}

// seeds resolves Join now: a name (a Kubernetes headless Service) stands
// for every member behind it at this moment, so it is looked up again on
// every attempt. This node's own address is left out. memberlist contacts
// each and counts those that answer; one that does not (a pod gone, an
// address no one serves yet) costs a refused connection. A seed that does
// not resolve is reported beside the addresses the others gave.
func (m *Membership) seeds() ([]string, error) {
	if len(m.cfg.Join) == 0 {
		return nil, nil
	}
	// A lookup hung on DNS must not hold up Leave.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		select {
		case <-m.stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	addrs, err := discovery.Expand(ctx, m.cfg.Resolver, m.cfg.Join)
	return slices.DeleteFunc(addrs, func(a string) bool { return a == m.self }), err
}

type delegate struct{ m *Membership }

func (d delegate) NodeMeta(limit int) []byte {
	b, err := msgpack.Marshal(d.m.cfg.Meta)
	if err != nil || len(b) > limit {
		// Never exceed the limit: memberlist panics on oversized metadata.
		d.m.log.Error("node metadata too large; advertising none", "bytes", len(b), "limit", limit)
		return nil
	}
	return b
}
func (d delegate) NotifyMsg(b []byte) {
	name, ok := strings.CutPrefix(string(b), goodbye)
	if !ok {
		return
	}
	d.m.mu.Lock()
	// The goodbye comes over TCP and memberlist's own leave over UDP, each
	// handled on its own goroutine: on a loaded host the leave can be
	// handled first and record a failure. A goodbye from a member already
	// recorded dead corrects that to left.
	mem, known := d.m.members[name]
	late := known && mem.State == Dead
	if late {
		d.m.members[name] = &Member{Name: mem.Name, Addr: mem.Addr, State: Left, Meta: mem.Meta, Since: mem.Since}
	} else {
		d.m.leaving[name] = true
	}
	d.m.mu.Unlock()
	if late {
		d.m.notify()
	}
}
func (delegate) GetBroadcasts(overhead, limit int) [][]byte { return nil }
func (delegate) LocalState(join bool) []byte                { return nil }
func (delegate) MergeRemoteState(buf []byte, join bool)     {}

// events must not block: memberlist calls them from its gossip goroutines.
type events struct{ m *Membership }

func (e events) NotifyJoin(n *memberlist.Node)   { e.m.update(n, Alive) }
func (e events) NotifyUpdate(n *memberlist.Node) { e.m.update(n, Alive) }
func (e events) NotifyLeave(n *memberlist.Node) {
	st := Dead
	e.m.mu.Lock()
	if e.m.leaving[n.Name] {
		st = Left
		delete(e.m.leaving, n.Name)
	}
	e.m.mu.Unlock()
	e.m.update(n, st)
}
