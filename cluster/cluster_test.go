package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"
	"go.uber.org/goleak"

	"stallfree/catalog"
	"stallfree/internal/testutil"
	"stallfree/source"
	"stallfree/store"
	"stallfree/transport"
)

// fasthttp's client (Describe's) has no Close: its cleaners end on their
// own once its idle connections expire, after the tests.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*Client).mCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*HostClient).connsCleaner"),
		goleak.IgnoreAnyFunction("github.com/valyala/fasthttp.(*TCPDialer).tcpAddrsClean"))
}

// fakeLocal fills items from memory and counts the fills; slow, when set,
// runs first, as a storage read would take its time.
type fakeLocal struct {
	items map[int][]byte
	fills int
	slow  func(i int)
}

func (f *fakeLocal) FillForPeer(_ context.Context, _ *catalog.Dataset, i int) (Fill, error) {
	if f.slow != nil {
		f.slow(i)
	}
	b, ok := f.items[i]
	if !ok {
		return Fill{}, errors.New("no such item")
	}
	f.fills++
	return Fill{Data: b, Sum: xxhash.Sum64(b)}, nil
}

func (*fakeLocal) Observe(uint32, int) {}

// oneMember starts a one-member cluster over a real catalog (raft on disk)
// holding a dataset of n items of size bytes.
func oneMember(t *testing.T, n, size int) (*Cluster, *catalog.Dataset, *store.Store, *fakeLocal) {
	t.Helper()
	return oneMemberWith(t, n, size, Config{})
}

// oneMemberWith is oneMember with cfg's HTTPAdvert and DeadGrace.
func oneMemberWith(t *testing.T, n, size int, cfg Config) (*Cluster, *catalog.Dataset, *store.Store, *fakeLocal) {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	cat, err := catalog.Open(catalog.Config{Key: testutil.ClusterKey(), NodeID: "c1", Bind: testutil.FreeAddr(t), Dir: t.TempDir(), Bootstrap: true, Timing: catalog.LocalTiming(), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := cat.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	local := &fakeLocal{items: map[int][]byte{}}
	entries := make([]source.Entry, n)
	for i := range entries {
		entries[i] = source.Entry{Key: fmt.Sprintf("k%03d", i), Size: int64(size)}
		local.items[i] = []byte(fmt.Sprintf("%0*d", size, i))
	}
	var d *catalog.Dataset
	for {
		d, _, err = cat.RegisterDataset("ds", "/nowhere", entries, 0)
		if !errors.Is(err, catalog.ErrNotLeader) && !errors.Is(err, catalog.ErrNoLeader) {
			break
		}
		time.Sleep(10 * time.Millisecond) // leadership settling right after the election
	}
	if err != nil {
		t.Fatal(err)
	}
	st, err := store.New(1<<20, store.MinIO{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	peer := testutil.FreeAddr(t)
	c := New(Config{Name: "c1", GossipBind: testutil.FreeAddr(t), Advertise: "127.0.0.1", PeerBind: peer, PeerAdvert: peer,
		HTTPAdvert: cfg.HTTPAdvert, DeadGrace: cfg.DeadGrace, Timing: LocalTiming(), Logger: log}, local, cat, st)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c, d, st, local
}

// A peer request that fails part-way (inline, on an item not resident;
// otherwise on a fill that fails) must unpin the items it had already
// gathered: a leaked pin keeps an evicted item's bytes charged to the
// budget for good.
func TestFailedPeerAnswerUnpinsWhatItGathered(t *testing.T) {
	c, d, st, local := oneMember(t, 4, 4<<10)
	if err := st.Put(store.MakeKey(d.ID, 0), local.items[0], xxhash.Sum64(local.items[0])); err != nil {
		t.Fatal(err)
	}
	delete(local.items, 1) // its fill fails
	for _, inline := range []bool{true, false} {
		_, err := c.servePeer(context.Background(), &transport.Request{Dataset: d.Name, DatasetVersion: d.Version,
			Indices: []uint32{0, 1}, Inline: inline})
		if err == nil {
			t.Fatalf("inline %v: a request for an item that cannot be filled succeeded", inline)
		}
	}
	st.Delete(store.MakeKey(d.ID, 0))
	if s := st.Stats(); s.Sending != 0 {
		t.Fatalf("after the failed answers, %d bytes stay pinned by a deleted item", s.Sending)
	}
}

// A peer's request is answered from memory when the item is resident and
// from the node's fill otherwise, byte for byte, and counted as bytes out.
func TestServePeerAnswersFromStoreThenFill(t *testing.T) {
	c, d, st, local := oneMember(t, 4, 100)
	if err := st.Put(store.MakeKey(d.ID, 1), local.items[1], xxhash.Sum64(local.items[1])); err != nil {
		t.Fatal(err)
	}
	items, err := c.servePeer(context.Background(), &transport.Request{Dataset: d.Name, DatasetVersion: d.Version,
		Indices: []uint32{1, 2}})
	if err != nil {
		t.Fatal(err)
	}
	for j, i := range []int{1, 2} {
		if !items[j].Found || string(items[j].Data) != string(local.items[i]) {
			t.Fatalf("item %d: found %v, %q", i, items[j].Found, items[j].Data)
		}
		if items[j].Release != nil {
			items[j].Release()
		}
	}
	if local.fills != 1 {
		t.Fatalf("%d fills, want 1 (item 1 was resident)", local.fills)
	}
	if got := c.Stats().PeerBytesOut; got != 200 {
		t.Fatalf("peer bytes out %d, want 200", got)
	}
	// A request for a dataset version this node does not have is refused.
	if _, err := c.servePeer(context.Background(), &transport.Request{Dataset: d.Name, DatasetVersion: d.Version + 1,
		Indices: []uint32{1}}); err == nil {
		t.Fatal("a request for a newer dataset version was answered")
	}
}

// Alone in the ring, a member owns every item.
func TestAloneOwnsEverything(t *testing.T) {
	c, d, _, _ := oneMember(t, 16, 10)
	for i := range 16 {
		if owner, self := c.Owner(d, i); !self || owner != "c1" {
			t.Fatalf("item %d: owner %q self %v", i, owner, self)
		}
	}
	if m := c.Members(); len(m) != 1 || m[0] != "c1" {
		t.Fatalf("members %v", m)
	}
	if !c.Joined() {
		t.Fatal("a member told to join no one is not joined")
	}
}

// A member told to join a seed that does not answer has not joined: alone,
// it must not serve as if it held its share of a cluster.
func TestUnansweredSeedIsNotJoined(t *testing.T) {
	st, err := store.New(1<<20, store.MinIO{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cat, err := catalog.Open(catalog.Config{Key: testutil.ClusterKey(), NodeID: "lone", Bind: testutil.FreeAddr(t), Dir: t.TempDir(), Timing: catalog.LocalTiming(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer cat.Close()
	peer := testutil.FreeAddr(t)
	c := New(Config{Name: "lone", GossipBind: testutil.FreeAddr(t), Advertise: "127.0.0.1", PeerBind: peer, PeerAdvert: peer,
		Join: []string{testutil.FreeAddr(t)}, Timing: LocalTiming(), Logger: slog.New(slog.DiscardHandler)}, &fakeLocal{}, cat, st)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Joined() {
		t.Fatal("joined with no seed answering")
	}
}

// A pushed item is kept when it is the manifest's size and this node owns
// it under the pusher's ring; otherwise the push is refused and nothing is
// kept.
func TestServePushKeepsOnlyWhatFits(t *testing.T) {
	c, d, st, local := oneMember(t, 4, 100)
	push := func(ring uint64, indices []uint32, data ...[]byte) ([]transport.Item, error) {
		req := &transport.Request{Dataset: d.Name, DatasetVersion: d.Version, Ring: ring, Indices: indices, Push: true, Data: data}
		for _, b := range data {
			req.Sums = append(req.Sums, xxhash.Sum64(b))
		}
		return c.servePeer(context.Background(), req)
	}
	ring := c.ring().Version()
	if _, err := push(ring, []uint32{0, 1}, local.items[0], []byte("short")); err == nil {
		t.Fatal("a push of the wrong size was taken")
	}
	if _, err := push(ring, []uint32{9}, local.items[0]); err == nil {
		t.Fatal("a push past the manifest was taken")
	}
	if _, err := push(ring+1, []uint32{0}, local.items[0]); !errors.Is(err, errRingDiffers) {
		t.Fatalf("a push under another ring: %v, want errRingDiffers", err)
	}
	if n := st.Stats().Items; n != 0 {
		t.Fatalf("refused pushes left %d items in the store", n)
	}
	items, err := push(ring, []uint32{2, 3}, local.items[2], local.items[3])
	if err != nil || !items[0].Found || !items[1].Found {
		t.Fatalf("a good push: %+v %v", items, err)
	}
	for _, i := range []uint32{2, 3} {
		ref, ok := st.Get(store.MakeKey(d.ID, i))
		if !ok || string(ref.Data) != string(local.items[int(i)]) {
			t.Fatalf("item %d not kept as pushed", i)
		}
		ref.Release()
	}
	if local.fills != 0 {
		t.Fatalf("a push made %d fills", local.fills)
	}
}

// A peer's ring version this node never reaches is waited for once, not
// once per request: a handoff or push under it is answered from this node's
// own ring at once after that.
func TestAwaitRingGivesUpOncePerVersion(t *testing.T) {
	c, _, _, _ := oneMember(t, 1, 10)
	ctx := context.Background()
	c.awaitRing(ctx, c.ring().Version())
	if n := c.ringWaits.Load(); n != 0 {
		t.Fatalf("%d waits for the ring this node has", n)
	}
	unknown := c.ring().Version() + 7
	for range 3 {
		c.awaitRing(ctx, unknown)
	}
	if n := c.ringWaits.Load(); n != 1 {
		t.Fatalf("%d waits for one unreachable ring version, want 1", n)
	}
	c.awaitRing(ctx, unknown+1)
	if n := c.ringWaits.Load(); n != 2 {
		t.Fatalf("%d waits after a second unreachable version, want 2", n)
	}
}

// Unset timers take their documented defaults (the zero Timing is the LAN
// profile), shorter under LocalTiming (loopback tests); set ones are kept.
func TestConfigDefaults(t *testing.T) {
	for _, tc := range []struct {
		cfg               Config
		peer, grace, ping time.Duration
	}{
		{Config{}, 2 * time.Second, time.Minute, time.Second},
		{Config{Timing: LocalTiming()}, 2 * time.Second, 5 * time.Second, 300 * time.Millisecond},
		{Config{PeerTimeout: time.Millisecond, DeadGrace: time.Hour}, time.Millisecond, time.Hour, time.Second},
	} {
		c := New(tc.cfg, &fakeLocal{}, nil, nil)
		if c.log == nil {
			t.Errorf("%+v: no logger", tc.cfg)
		}
		if c.cfg.PeerTimeout != tc.peer || c.cfg.DeadGrace != tc.grace || c.vouch.timeout != tc.ping || c.vouch.interval != tc.ping {
			t.Errorf("%+v: peer timeout %v, grace %v, ping %v/%v", tc.cfg, c.cfg.PeerTimeout, c.cfg.DeadGrace, c.vouch.timeout, c.vouch.interval)
		}
		wantMax := 10 * time.Second
		if tc.cfg.Timing == LocalTiming() {
			wantMax = 3 * time.Second
		}
		if c.vouch.max != wantMax {
			t.Errorf("%+v: a dead member held at most %v, want %v", tc.cfg, c.vouch.max, wantMax)
		}
		c.vouch.close()
		c.client.Close()
	}
}

// Before it has seen any member (an empty ring), a node owns every item.
func TestEmptyRingOwnsEverything(t *testing.T) {
	c := New(Config{Name: "c1"}, &fakeLocal{}, nil, nil)
	defer c.client.Close()
	defer c.vouch.close()
	d := &catalog.Dataset{Name: "ds", Manifest: catalog.NewManifest([]source.Entry{{Key: "a", Size: 1}, {Key: "b", Size: 1}})}
	for i := range 2 {
		if owner, self := c.Owner(d, i); owner != "" || !self {
			t.Fatalf("item %d on an empty ring: owner %q, self %v", i, owner, self)
		}
	}
	if !c.Ring().Empty() || len(c.Members()) != 0 {
		t.Fatal("a ring before any member is not empty")
	}
}
