package cluster

import (
	"context"
	"io"
	"log"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"github.com/hashicorp/memberlist"
	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
	"stallfree/internal/testutil"
	"stallfree/membership"
	"stallfree/transport"
)

// countingListener counts the connections accepted and not yet closed.
type countingListener struct {
	net.Listener
	open atomic.Int64
}

type countedConn struct {
	net.Conn
	once sync.Once
	l    *countingListener
}

func (c *countedConn) Close() error {
	c.once.Do(func() { c.l.open.Add(-1) })
	return c.Conn.Close()
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.open.Add(1)
	return &countedConn{Conn: c, l: l}, nil
}

// peerServer is a member's peer transport on its own: it answers every
// index from items, and counts the connections open to it.
func peerServer(t *testing.T, items map[int][]byte) (string, *countingListener) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &countingListener{Listener: ln}
	srv := transport.NewServer(nil, func(_ context.Context, req *transport.Request) ([]transport.Item, error) {
		out := make([]transport.Item, len(req.Indices))
		for j, i := range req.Indices {
			b := items[int(i)]
			out[j] = transport.Item{Data: b, Sum: xxhash.Sum64(b), Found: true}
		}
		return out, nil
	}, slog.New(slog.DiscardHandler))
	srv.Figures = func() transport.Figures { return transport.Figures{Items: 42, Bytes: 4200} }
	go srv.Serve(cl)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().String(), cl
}

// metaDelegate advertises a member's metadata as membership does.
type metaDelegate struct{ meta []byte }

func (d metaDelegate) NodeMeta(int) []byte                  { return d.meta }
func (metaDelegate) NotifyMsg([]byte)                       {}
func (metaDelegate) GetBroadcasts(int, int) [][]byte        { return nil }
func (metaDelegate) LocalState(bool) []byte                 { return nil }
func (metaDelegate) MergeRemoteState(buf []byte, join bool) {}

// silentMember joins seed's gossip as name, advertising meta, with bare
// memberlist: its gossip can then stop without a word (Shutdown without
// Leave), as a starved host's does, while the rest of it keeps running.
func silentMember(t *testing.T, name, seed string, meta membership.Meta) *memberlist.Memberlist {
	t.Helper()
	b, err := msgpack.Marshal(meta)
	if err != nil {
		t.Fatal(err)
	}
	host, port, err := net.SplitHostPort(testutil.FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	mc := memberlist.DefaultLocalConfig()
	mc.Name = name
	mc.BindAddr, mc.AdvertiseAddr = host, host
	mc.BindPort, _ = strconv.Atoi(port)
	mc.AdvertisePort = mc.BindPort
	mc.ProbeInterval, mc.ProbeTimeout, mc.GossipInterval = 200*time.Millisecond, 100*time.Millisecond, 50*time.Millisecond
	mc.Delegate = metaDelegate{meta: b}
	mc.Logger = log.New(io.Discard, "", 0)
	ml, err := memberlist.Create(mc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ml.Shutdown() })
	if _, err := ml.Join([]string{seed}); err != nil {
		t.Fatal(err)
	}
	return ml
}

// A member whose gossip falls silent while its peer transport still
// answers (a starved host): gossip declares it dead, but the voucher keeps
// it on the ring, its items are still fetched from it, and the cluster view
// shows it dead without asking for its figures (which it would give). Once the voucher lets it go
// the ring drops it and the pooled connections to it are closed.
func TestSilentGossipMemberStaysWhileItAnswers(t *testing.T) {
	c, d, _, local := oneMember(t, 64, 10)
	c.vouch.mu.Lock()
	c.vouch.max = time.Hour // released by hand below
	c.vouch.mu.Unlock()
	peer, conns := peerServer(t, local.items)
	ml := silentMember(t, "c2", c.cfg.GossipBind, membership.Meta{Incarnation: time.Now().UnixNano(), Peer: peer,
		HTTP: "127.0.0.1:1"})
	testutil.Await(t, "c2 on c1's ring", func() bool { return slices.Contains(c.Members(), "c2") })
	ofC2 := ownedBy(c, d, "c2")
	if len(ofC2) == 0 {
		t.Fatal("c2 owns nothing: pick another item count")
	}
	ctx := context.Background()
	fetch := func() {
		t.Helper()
		f, ok := c.FromOwner(ctx, "c2", d, ofC2[0])
		if !ok || string(f.Data) != string(local.items[ofC2[0]]) {
			t.Fatalf("item %d from c2: %v", ofC2[0], ok)
		}
	}
	fetch()
	if m := describe(c, "c2"); m.State != string(membership.Alive) || m.Items != 42 || m.Bytes != 4200 {
		t.Fatalf("c2 alive as c1 describes it: %+v; want its figures", m)
	}

	ml.Shutdown() // silent: no leave
	testutil.Await(t, "c1's gossip to declare c2 dead and the voucher to vouch for it", func() bool {
		m, ok := c.ml.Get("c2")
		return ok && m.State == membership.Dead && c.Stats().MembersVouched == 1
	})
	if !slices.Contains(c.Members(), "c2") {
		t.Fatalf("c2, dead but answering, left the ring: %v", c.Members())
	}
	fetch()
	if m := describe(c, "c2"); m.State != string(membership.Dead) || m.Items != 0 || m.Bytes != 0 {
		t.Fatalf("c2 as c1 describes it: %+v; want dead, without figures", m)
	}
	if conns.open.Load() == 0 {
		t.Fatal("no connection pooled to c2")
	}

	c.vouch.mu.Lock()
	c.vouch.max = 0 // the next ping's verdict drops it
	c.vouch.mu.Unlock()
	testutil.Await(t, "c1's ring to drop c2", func() bool { return !slices.Contains(c.Members(), "c2") })
	testutil.Await(t, "the connections to c2 to close", func() bool { return conns.open.Load() == 0 })
}

// A member that leaves: the ring drops it at once, and the connections
// pooled to it are closed.
func TestLeftMemberConnectionsClose(t *testing.T) {
	c, d, _, local := oneMember(t, 64, 10)
	peer, conns := peerServer(t, local.items)
	ml, err := membership.Join(membership.Config{Name: "c2", Bind: testutil.FreeAddr(t), Advertise: "127.0.0.1", Join: []string{c.cfg.GossipBind},
		Timing: membership.LocalTiming(), Logger: slog.New(slog.DiscardHandler), Meta: membership.Meta{Incarnation: time.Now().UnixNano(), Peer: peer}})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "c2 on c1's ring", func() bool { return slices.Contains(c.Members(), "c2") })
	ofC2 := ownedBy(c, d, "c2")
	if len(ofC2) == 0 {
		t.Fatal("c2 owns nothing: pick another item count")
	}
	if _, ok := c.FromOwner(context.Background(), "c2", d, ofC2[0]); !ok || conns.open.Load() == 0 {
		t.Fatalf("item %d from c2: %v, %d connections", ofC2[0], ok, conns.open.Load())
	}
	if err := ml.Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "c1 to see c2 leave", func() bool { m, ok := c.ml.Get("c2"); return ok && m.State == membership.Left })
	testutil.Await(t, "c1's ring to drop c2", func() bool { return !slices.Contains(c.Members(), "c2") })
	testutil.Await(t, "the connections to c2 to close", func() bool { return conns.open.Load() == 0 })
}

// describe is member name as c describes it.
func describe(c *Cluster, name string) api.Member {
	for _, m := range c.Describe(api.Member{Name: "c1"}) {
		if m.Name == name {
			return m
		}
	}
	return api.Member{}
}
