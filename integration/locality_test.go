package integration

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
	"stallfree/internal/testutil"
)

func rankOrder(t *testing.T, n *proc, job string, epoch, rank int) api.RankOrder {
	t.Helper()
	o, err := n.c.RankOrder(context.Background(), job, epoch, rank)
	if err != nil {
		t.Fatalf("%s epoch %d rank %d: %v", n.name, epoch, rank, err)
	}
	return o
}

func TestLocalityAwareOrders(t *testing.T) {
	testutil.Long(t)
	const items, world, batch = 5000, 4, 256
	dir, files := dataset(t, items, 1024)
	keys := make([]string, 0, items)
	for k := range files {
		keys = append(keys, k)
	}
	sort.Strings(keys) // manifest order
	nodes := startCluster(t, clusterOpts{nodes: world})
	register(t, nodes[0], "ds", dir)
	ctx := context.Background()
	job := api.Job{Name: "train", Dataset: "ds", Seed: 11, WorldSize: world, BatchSize: batch, Ranks: names(nodes)}
	if _, err := nodes[3].c.PutJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	// Cache every item at its owner, so a rank's local/peer hits show where its samples live.
	for _, n := range nodes {
		if _, err := n.c.StartWarmup(ctx, "ds"); err != nil {
			t.Fatal(err)
		}
	}
	testutil.AwaitWithin(t, 60*time.Second, "warm-up", func() bool { return sumStats(t, nodes).ItemsCached == items })

	var prev [][]int
	for epoch := range 2 {
		seen := map[int]bool{}
		var orders [][]int
		for r, n := range nodes {
			o := rankOrder(t, n, "train", epoch, r)
			// Asked twice, and from another node: the same order.
			again := rankOrder(t, nodes[(r+1)%world], "train", epoch, r)
			if !slices.Equal(o.Indices, again.Indices) || !slices.Equal(o.Indices, rankOrder(t, n, "train", epoch, r).Indices) {
				t.Fatalf("epoch %d rank %d: order differs between requests or nodes", epoch, r)
			}
			if len(o.Indices) != items/world {
				t.Fatalf("epoch %d rank %d: %d samples, want %d", epoch, r, len(o.Indices), items/world)
			}
			for _, i := range o.Indices {
				if seen[i] {
					t.Fatalf("epoch %d: index %d given twice", epoch, i)
				}
				seen[i] = true
			}
			if asc := ascending(o.Indices); asc < 0.4 || asc > 0.6 {
				t.Fatalf("epoch %d rank %d: %.2f of neighbours ascend: follows the index order", epoch, r, asc)
			}
			orders = append(orders, o.Indices)
		}
		if prev != nil && slices.Equal(prev[0], orders[0]) {
			t.Fatal("epochs 0 and 1 have the same order")
		}
		prev = orders

		// Each rank reads its batches through its own node: count where samples came from.
		var local, peer uint64
		for r, n := range nodes {
			before := mustStats(t, n)
			o := rankOrder(t, n, "train", epoch, r)
			for b := range o.Batches {
				got := jobBatch(t, n, "train", epoch, r, b)
				want := o.Indices[b*batch : min((b+1)*batch, len(o.Indices))]
				if len(got) != len(want) {
					t.Fatalf("batch %d: %d items, want %d", b, len(got), len(want))
				}
				for x, it := range got {
					if it.Key != keys[want[x]] || !bytes.Equal(it.Data, files[it.Key]) {
						t.Fatalf("epoch %d rank %d batch %d item %d: wrong item or bytes", epoch, r, b, x)
					}
				}
			}
			after := mustStats(t, n)
			local += after.HitsLocal - before.HitsLocal
			peer += after.HitsPeer - before.HitsPeer
			if after.SourceReads != before.SourceReads {
				t.Fatalf("rank %d read storage", r)
			}
		}
		frac := float64(peer) / float64(local+peer)
		t.Logf("epoch %d: %.3f of samples came from another node (%d local, %d peer)", epoch, frac, local, peer)
		if !(frac <= 0.05) { // NaN fails too
			t.Fatalf("epoch %d: remote fraction %.3f > 0.05", epoch, frac)
		}
	}
	// Plain sampling for contrast: rank r reading a contiguous quarter of a random order.
	var before, after uint64
	for _, n := range nodes {
		s := mustStats(t, n)
		before += s.HitsPeer
	}
	for r, n := range nodes {
		for _, i := range permOf(items, r) {
			if _, err := n.c.ItemByIndex(ctx, "ds", i); err != nil {
				t.Fatal(err)
			}
		}
	}
	for _, n := range nodes {
		s := mustStats(t, n)
		after += s.HitsPeer
	}
	plain := float64(after-before) / float64(world*(items/world))
	t.Logf("plain sampling: %.3f of samples came from another node", plain)
	// With 4 nodes, 3/4 of a random quarter lives elsewhere: the contrast is
	// what shows the locality-aware orders are doing the work.
	if plain < 0.5 {
		t.Fatalf("plain sampling: only %.3f remote, want > 0.5 (did the nodes share items?)", plain)
	}
}

func permOf(n, r int) []int {
	out := make([]int, 0, n/4)
	for i := r; i < n; i += 4 {
		out = append(out, (i*7919)%n)
	}
	return out
}

func ascending(xs []int) float64 {
	up := 0
	for i := 1; i < len(xs); i++ {
		if xs[i] > xs[i-1] {
			up++
		}
	}
	return float64(up) / float64(len(xs)-1)
}

type batchItem struct {
	Key  string `msgpack:"key"`
	Data []byte `msgpack:"data"`
}

func jobBatch(t *testing.T, n *proc, job string, epoch, rank, b int) []batchItem {
	t.Helper()
	resp, err := n.c.Do(context.Background(), http.MethodGet, fmt.Sprintf("/v1/jobs/%s/epochs/%d/ranks/%d/batches/%d", job, epoch, rank, b), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var items []batchItem
	if err := msgpack.NewDecoder(resp.Body).Decode(&items); err != nil {
		t.Fatal(err)
	}
	return items
}

// A join in the middle of an epoch costs locality, never correctness: the
// epoch's orders stay those pinned when it began, on every node, and the next
// epoch is again a partition of the dataset.
func TestOrdersSurviveMembershipChange(t *testing.T) {
	testutil.Long(t)
	const items = 600
	dir, _ := dataset(t, items, 256)
	nodes := startCluster(t, clusterOpts{nodes: 2})
	register(t, nodes[0], "ds", dir)
	ctx := context.Background()
	job := api.Job{Name: "train", Dataset: "ds", Seed: 4, WorldSize: 2, BatchSize: 32, Ranks: []string{"n1", "n2"}}
	if _, err := nodes[1].c.PutJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	before := [][]int{rankOrder(t, nodes[0], "train", 0, 0).Indices, rankOrder(t, nodes[1], "train", 0, 1).Indices}
	n3 := startNode(t, nodeOpts{name: "n3", join: []string{nodes[0].gossip}})
	all := append(nodes, n3)
	waitMembers(t, all, []string{"n1", "n2", "n3"})
	for _, n := range all {
		for r := range 2 {
			if got := rankOrder(t, n, "train", 0, r).Indices; !slices.Equal(got, before[r]) {
				t.Fatalf("%s changed rank %d's order of the running epoch", n.name, r)
			}
		}
	}
	seen := map[int]bool{}
	for r := range 2 {
		o := rankOrder(t, all[r], "train", 1, r).Indices
		if !slices.Equal(o, rankOrder(t, n3, "train", 1, r).Indices) {
			t.Fatalf("nodes disagree on epoch 1 rank %d", r)
		}
		for _, i := range o {
			if seen[i] {
				t.Fatalf("epoch 1 gives index %d twice", i)
			}
			seen[i] = true
		}
	}
	if len(seen) != items {
		t.Fatalf("epoch 1 covers %d of %d items", len(seen), items)
	}
}
