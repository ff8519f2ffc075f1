package node

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/cluster"
	"stallfree/internal/testutil"
)

// startNode runs a node, alone or as a one-member cluster, with a directory
// of items random files of size bytes registered as dataset "ds".
func startNode(t *testing.T, items, size int, memory uint64, clustered bool) (*Node, *catalog.Dataset, map[string][]byte) {
	t.Helper()
	return startNodeWith(t, items, size, memory, clustered, "lru")
}

func startNodeWith(t *testing.T, items, size int, memory uint64, clustered bool, policy string, tweaks ...func(*Config)) (*Node, *catalog.Dataset, map[string][]byte) {
	t.Helper()
	dir, files := testutil.RandomFiles(t, items, size)
	cfg := Config{Name: "t1", ClusterKey: testutil.ClusterKey(), RaftBind: testutil.FreeAddr(t), DataDir: t.TempDir(), Bootstrap: true, Memory: memory,
		Policy: policy, Timing: LocalTiming(), Logger: slog.New(slog.DiscardHandler)}
	if clustered {
		cfg.GossipBind, cfg.Advertise, cfg.PeerBind = testutil.FreeAddr(t), "127.0.0.1", testutil.FreeAddr(t)
		cfg.PeerAdvert = cfg.PeerBind
	}
	for _, tweak := range tweaks {
		tweak(&cfg)
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := n.Control().RegisterAtStart(ctx, []string{"ds=" + dir}); err != nil {
		t.Fatal(err)
	}
	d, err := n.Control().Dataset(ctx, "ds")
	if err != nil {
		t.Fatal(err)
	}
	return n, d, files
}

// Storage reads land in recycled buffers. With a cache too small to hold
// the dataset most Gets read storage, and every caller's bytes must stay the
// file's until it releases them, however busy the pool is.
func TestRecycledStorageReadsStayExact(t *testing.T) {
	const items, size = 64, 20 << 10
	n, d, files := startNode(t, items, size, 8*size, false)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 200 {
				i := r.IntN(items)
				it, err := n.Get(context.Background(), d, i)
				if err != nil {
					errs <- err
					return
				}
				want := files[d.Manifest.Key(i)]
				runtime.Gosched() // let a buffer recycled too early be reused meanwhile
				if !bytes.Equal(it.Data, want) {
					errs <- fmt.Errorf("item %d (%s): bytes differ from the file", i, it.Cache)
					it.Release()
					return
				}
				it.Release()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if st := n.Stats(); st.SourceReads < 200 {
		t.Fatalf("only %d storage reads: the test did not exercise recycled fills", st.SourceReads)
	}
}

// Warm-up stops once the store admits nothing more: reading the rest would
// only cost storage bandwidth (MinIO never evicts to make room).
func TestWarmupStopsWhenFull(t *testing.T) {
	const items, size = 200, 4 << 10
	n, d, _ := startNodeWith(t, items, size, 20*(size+256), false, "minio")
	n.StartWarmup(d)
	awaitWarmup(t, n, d)
	p, st := n.WarmupProgress(d), n.Stats()
	if !p.Full || p.Error != "" {
		t.Fatalf("progress %+v: want stopped full", p)
	}
	// The workers in flight when the store filled may each have read one
	// item more; nothing beyond.
	if limit := uint64(st.ItemsCached) + warmConcurrency; st.SourceReads > limit {
		t.Fatalf("%d storage reads for %d cached items: warm-up went on past a full store", st.SourceReads, st.ItemsCached)
	}
	if p.Done >= p.Total {
		t.Fatalf("done %d of %d with a store for ~20 items", p.Done, p.Total)
	}
}

// awaitWarmup waits until the node's warm-up of d has ended.
func awaitWarmup(t *testing.T, n *Node, d *catalog.Dataset) {
	t.Helper()
	testutil.Await(t, "the warm-up to end", func() bool { return !n.WarmupProgress(d).Running })
}

// movingPeers is a lone node's view that changes once a warm-up has listed
// what it owns: from then on another member owns every odd item.
type movingPeers struct {
	noPeers
	calls, listed atomic.Int64
	fromOwner     atomic.Int64
}

func (p *movingPeers) Owner(d *catalog.Dataset, i int) (string, bool) {
	if p.calls.Add(1) <= p.listed.Load() || i%2 == 0 {
		return p.self, true
	}
	return "other", false
}

func (p *movingPeers) FromOwner(context.Context, string, *catalog.Dataset, int) (cluster.Fill, bool) {
	p.fromOwner.Add(1)
	return cluster.Fill{}, false
}

// A ring change during a warm-up is not a full store: items that moved to
// another member are left to it, and the warm-up ends complete (a 24-node
// warm-up used to end "full" while the members were still joining).
func TestWarmupLeavesMovedItemsToTheirOwner(t *testing.T) {
	const items, size = 100, 1 << 10
	n, d, _ := startNode(t, items, size, 1<<20, false)
	peers := &movingPeers{noPeers: newNoPeers(n.cfg.Name)}
	peers.listed.Store(items) // ownedIndices asks once per item
	n.peers = peers
	n.StartWarmup(d)
	awaitWarmup(t, n, d)
	p, st := n.WarmupProgress(d), n.Stats()
	if p.Full || p.Error != "" || p.Done != items || p.Total != items {
		t.Fatalf("progress %+v: want %d of %d done, not full", p, items, items)
	}
	if st.ItemsCached != items/2 || st.SourceReads != items/2 || peers.fromOwner.Load() != 0 {
		t.Fatalf("%d cached, %d storage reads, %d peer fetches: want the %d even items read and cached, nothing fetched",
			st.ItemsCached, st.SourceReads, peers.fromOwner.Load(), items/2)
	}
}

// After a resize, the epoch its ranks resume is the one the read-ahead
// follows: the cache policy's plan for it is the re-split order, not the
// new layout's plain order.
func TestCachePolicyFollowsAResumedEpoch(t *testing.T) {
	n, _, _ := startNode(t, 60, 64, 1<<20, false)
	ctx := context.Background()
	old, err := n.Control().PutJob(ctx, api.Job{Name: "train", Dataset: "ds", Seed: 3, WorldSize: 2, BatchSize: 4, Ranks: []string{"t1", "t1"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := n.Control().RankOrder(ctx, "train", 0, 0); err != nil { // epoch 0 starts under 2 ranks
		t.Fatal(err)
	}
	if _, err := n.Control().PutJob(ctx, api.Job{Name: "train", Dataset: "ds", Seed: 3, WorldSize: 1, BatchSize: 4, Ranks: []string{"t1"}}); err != nil {
		t.Fatal(err)
	}
	host := clairvoyantHost{n}
	plain, err := host.Plan("train", 0)
	if err != nil || len(plain.Ranks[0]) != 60 {
		t.Fatalf("before the resume: %v, want the plain 1-rank order of 60", err)
	}
	o, err := n.Control().ResumedOrder(ctx, "train", 0, 0, old.Version, 10)
	if err != nil || len(o.Indices) != 40 {
		t.Fatalf("resumed order: %d samples, %v; want the 2 x 20 left", len(o.Indices), err)
	}
	ep, err := host.Plan("train", 0)
	if err != nil || len(ep.Ranks[0]) != len(o.Indices) {
		t.Fatalf("the policy's plan after the resume: %v; want the re-split order", err)
	}
	for x, i := range ep.Ranks[0] {
		if int(i) != o.Indices[x] {
			t.Fatalf("position %d: the policy plans item %d, the rank reads %d", x, i, o.Indices[x])
		}
	}
	if next, err := host.Plan("train", 1); err != nil || len(next.Ranks[0]) != 60 {
		t.Fatalf("epoch 1: %v, want a plain epoch", err)
	}
}

// A node that knows no leader is not ready, and says why (the rest of what
// such a node does, its writes refused with 503, is control's
// TestWritesWithoutALeader).
func TestNotReadyWithoutALeader(t *testing.T) {
	n, err := New(Config{Name: "f1", RaftBind: testutil.FreeAddr(t), DataDir: t.TempDir(), Memory: 1 << 20, Policy: "lru",
		Timing: LocalTiming(), Logger: testutil.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if ok, why := n.Ready(); ok || why == "" {
		t.Fatalf("ready without a leader: %v %q", ok, why)
	}
}

// A warm-up asked for again while it runs is the same warm-up: its progress
// comes back and nothing starts twice (storage read once per item).
func TestWarmupAskedAgainWhileItRuns(t *testing.T) {
	const items, size = 8, 1000
	n, d, _ := startNodeWith(t, items, size, 64<<20, false, "lru", func(c *Config) { c.SourceRate = 4 * size })
	first := n.StartWarmup(d)
	n.mu.Lock()
	w := n.warmups[d.Name]
	n.mu.Unlock()
	if !first.Running || first.Total != items {
		t.Fatalf("progress %+v", first)
	}
	again := n.StartWarmup(d)
	n.mu.Lock()
	same := n.warmups[d.Name] == w
	n.mu.Unlock()
	if !same || again.Total != items {
		t.Fatalf("a second warm-up started while the first ran (%+v)", again)
	}
	awaitWarmup(t, n, d)
	if reads := n.Stats().SourceReads; reads != items {
		t.Fatalf("%d storage reads for %d items", reads, items)
	}
}
