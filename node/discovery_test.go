package node_test

// Three real members (gossip, raft on disk, peer transport, HTTP API) find
// each other as a StatefulSet's pods do: through one name, a headless
// Service, that resolves to every pod's address. The name also lists
// addresses with nothing behind them (pods gone, or not serving yet), and
// at first lists none of the live ones: DNS lags behind the pods, so only
// looking the name up again on every retry gets them together.

import (
	"context"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/client"
	"stallfree/discovery"
	"stallfree/httpapi"
	"stallfree/internal/testutil"
	"stallfree/node"
)

// dnsTable is a resolver whose answers the test changes as it goes.
type dnsTable struct {
	mu      sync.Mutex
	hosts   map[string][]string
	lookups int
}

func (d *dnsTable) set(host string, addrs ...string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.hosts[host] = addrs
}

func (d *dnsTable) LookupHost(_ context.Context, host string) ([]string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lookups++
	a, ok := d.hosts[host]
	if !ok {
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return slices.Clone(a), nil
}

func (d *dnsTable) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lookups
}

// sharedGossipPort is a port free for gossip (TCP and UDP) on every one of
// the loopback addresses: the pods of a StatefulSet all listen on the same
// port, each on its own IP.
func sharedGossipPort(t *testing.T, ips ...string) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", ips[0]+":0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		free := true
		for _, ip := range ips {
			addr := net.JoinHostPort(ip, strconv.Itoa(port))
			tl, err := net.Listen("tcp", addr)
			if err != nil {
				free = false
				break
			}
			u, err := net.ListenPacket("udp", addr)
			tl.Close()
			if err != nil {
				free = false
				break
			}
			u.Close()
		}
		if free {
			return port
		}
	}
	t.Fatal("no port free on every address")
	return 0
}

// pod starts a member on its own loopback IP with the StatefulSet's flags:
// --join NAME:PORT and the bootstrap rule decided from its name.
func pod(t *testing.T, name, ip string, port int, seed string, dns *dnsTable) (*node.Node, *client.Client) {
	t.Helper()
	first, err := discovery.BootstrapsByOrdinal(name)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		t.Fatal(err)
	}
	peer := testutil.FreeAddr(t)
	cfg := node.Config{Name: name, ClusterKey: testutil.ClusterKey(), HTTPAdvert: ln.Addr().String(), PeerAdvert: peer, PeerBind: peer, RaftBind: testutil.FreeAddr(t),
		DataDir: t.TempDir(), Bootstrap: first, Memory: 64 << 20, Policy: "lru", Timing: node.LocalTiming(),
		Logger: slog.New(slog.DiscardHandler), GossipBind: net.JoinHostPort(ip, strconv.Itoa(port)), Advertise: ip,
		Join: []string{seed}, Resolver: dns}
	n, err := node.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	srv := httpapi.New(n, "", slog.New(slog.DiscardHandler))
	go srv.Serve(ln)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		n.Close()
	})
	return n, client.New(ln.Addr().String(), "")
}

func TestPodsJoinThroughANameOfManyAddresses(t *testing.T) {
	live := []string{"127.0.0.1", "127.0.0.2", "127.0.0.3"}
	dead := []string{"127.0.0.4", "127.0.0.5"} // nothing listens there: connections are refused
	port := sharedGossipPort(t, live...)
	seed := net.JoinHostPort("stallfree-headless", strconv.Itoa(port))
	dns := &dnsTable{hosts: map[string][]string{}}
	// Before any pod is ready the name lists only addresses no one serves.
	dns.set("stallfree-headless", dead...)

	// Parallel pod management: the joiners may start before ordinal 0.
	// The test reads the cluster as users do, over each member's HTTP API.
	p2, c2 := pod(t, "stallfree-2", live[2], port, seed, dns)
	p1, c1 := pod(t, "stallfree-1", live[1], port, seed, dns)
	p0, c0 := pod(t, "stallfree-0", live[0], port, seed, dns)
	pods, clients := []*node.Node{p0, p1, p2}, []*client.Client{c0, c1, c2}
	ctx := context.Background()
	view := func(c *client.Client) api.Cluster {
		cl, err := c.Cluster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}
	testutil.Await(t, "ordinal 0 to lead the cluster it bootstrapped", func() bool { return view(c0).Leader == "stallfree-0" })
	for i, p := range pods[1:] {
		if ok, _ := p.Ready(); ok {
			t.Fatalf("%s is ready though the name lists none of its peers", p.Name())
		}
		if l := view(clients[i+1]).Leader; l != "" {
			t.Fatalf("%s follows %q before it could reach anyone: it formed a cluster of its own", p.Name(), l)
		}
	}

	// The pods' addresses appear in DNS, mixed with the dead ones.
	before := dns.count()
	dns.set("stallfree-headless", dead[0], live[2], live[0], dead[1], live[1])
	for _, p := range pods {
		testutil.Await(t, p.Name()+" to be ready", func() bool { ok, _ := p.Ready(); return ok })
	}
	if dns.count() <= before {
		t.Fatal("the name was not looked up again after the first attempt")
	}
	names := []string{"stallfree-0", "stallfree-1", "stallfree-2"}
	for i, c := range clients {
		testutil.Await(t, names[i]+" to see all three as alive voters of one leader's cluster", func() bool {
			cl := view(c)
			var got []string
			for _, m := range cl.Members {
				if m.State == "alive" && m.Raft == "voter" {
					got = append(got, m.Name)
				}
			}
			slices.Sort(got)
			return cl.Leader != "" && slices.Equal(got, names)
		})
	}

	// One cluster: a write made through the last pod is read on the others.
	dir, _ := files(t, 12, 100)
	if _, err := c2.PutDataset(ctx, "ds", dir); err != nil {
		t.Fatal(err)
	}
	for i, c := range clients {
		testutil.Await(t, names[i]+" to list the dataset", func() bool {
			ds, err := c.Datasets(ctx)
			return err == nil && len(ds) == 1 && ds[0].Name == "ds" && ds[0].Items == 12
		})
	}
}
