// Package testcluster starts real Stallfree nodes in one test process (raft
// on disk, gossip, the peer transport and each node's HTTP API on loopback,
// local timing) and adds each only once the cluster has taken it in: olric's
// testcluster, for this project. Tests of packages above node use it; the
// integration package starts real processes instead.
package testcluster

import (
	"context"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"stallfree/catalog"
	"stallfree/httpapi"
	"stallfree/internal/testutil"
	"stallfree/node"
)

// timing is the local profile but raft's: with a leader lease of 150 ms a
// leader of two voters in one process under -race, with the machine shared,
// stepped down now and then when its new follower answered late, and a
// write relayed to it in that moment was refused (503, retry). Raft's LAN
// timers cost a second more at the first election, nothing after.
func timing() node.Timing {
	t := node.LocalTiming()
	t.Catalog = catalog.LANTiming()
	return t
}

// Member is one node of the cluster and the address of its HTTP API.
type Member struct {
	*node.Node
	Name string
	HTTP string // host:port
	// Gossip is its gossip address, which later members join through.
	Gossip string
}

// Cluster is the nodes started so far. Everything it starts is stopped when
// the test ends.
type Cluster struct {
	t       testing.TB
	mu      sync.Mutex
	members []*Member
	// Config, when set, adjusts each member's config before it starts.
	Config func(*node.Config)
	// Serve, when set, adds to each member's HTTP API (the services
	// cachenode adds: groups, checkpoints) before it serves.
	Serve func(*node.Node, *httpapi.Server)
}

// New returns an empty cluster bound to t.
func New(t testing.TB) *Cluster { return &Cluster{t: t} }

// Members are the members added so far, in order.
func (c *Cluster) Members() []*Member {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.members)
}

// Add starts a member named name and returns once the cluster has taken it
// in: the first bootstraps raft and leads; a later one joins the first's
// gossip, and Add waits until it is ready (joined, caught up with the
// catalog), knows the leader, and every member's ring holds every member.
func (c *Cluster) Add(name string) *Member {
	t := c.t
	t.Helper()
	c.mu.Lock()
	first := len(c.members) == 0
	var join string
	if !first {
		join = c.members[0].Gossip
	}
	c.mu.Unlock()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	peer := testutil.FreeAddr(t)
	cfg := node.Config{Name: name, ClusterKey: testutil.ClusterKey(), HTTPAdvert: ln.Addr().String(), PeerAdvert: peer, PeerBind: peer,
		RaftBind: testutil.FreeAddr(t), DataDir: t.TempDir(), Bootstrap: first, Memory: 64 << 20, Policy: "lru",
		Timing: timing(), Logger: testutil.Discard(), GossipBind: testutil.FreeAddr(t), Advertise: "127.0.0.1"}
	if !first {
		cfg.Join = []string{join}
	}
	if c.Config != nil {
		c.Config(&cfg)
	}
	n, err := node.New(cfg)
	if err != nil {
		ln.Close()
		t.Fatal(err)
	}
	srv := httpapi.New(n, cfg.Token, testutil.Discard())
	if c.Serve != nil {
		c.Serve(n, srv)
	}
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		n.Close()
	})
	m := &Member{Node: n, Name: name, HTTP: ln.Addr().String(), Gossip: cfg.GossipBind}
	c.mu.Lock()
	c.members = append(c.members, m)
	all := slices.Clone(c.members)
	c.mu.Unlock()
	if first {
		testutil.Await(t, name+" to lead", n.Control().IsLeader)
	}
	testutil.Await(t, name+" to be ready", func() bool {
		ok, _ := n.Ready()
		return ok && n.Control().LeaderHTTP() != ""
	})
	testutil.Await(t, "every ring to hold every member", func() bool {
		for _, x := range all {
			if len(x.Cluster().Members) != len(all) {
				return false
			}
			for _, mm := range x.Cluster().Members {
				if mm.State != "alive" {
					return false
				}
			}
		}
		return true
	})
	return m
}
