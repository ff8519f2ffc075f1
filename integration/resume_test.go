package integration

import (
	"context"
	"net/http"
	"slices"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/internal/testutil"
)

// A 4-rank job interrupted mid-epoch resumes as 3 ranks on 3 nodes (the
// fourth node gone): the samples the old ranks had left are re-split among
// the new ones, each exactly once, in equal shares, mostly local; any node
// gives the same orders; the next epoch is a plain 3-rank epoch.
func TestResizedJobResumesTheInterruptedEpoch(t *testing.T) {
	testutil.Long(t)
	const items, batch, position = 6000, 256, 512
	dir, _ := dataset(t, items, 256)
	nodes := startCluster(t, clusterOpts{nodes: 4})
	register(t, nodes[0], "ds", dir)
	ctx := context.Background()
	old, err := nodes[0].c.PutJob(ctx, api.Job{Name: "train", Dataset: "ds", Seed: 5, WorldSize: 4, BatchSize: batch, Ranks: names(nodes)})
	if err != nil {
		t.Fatal(err)
	}
	// Epoch 0 under 4 ranks; every rank consumes position samples.
	var remaining []int
	for r, n := range nodes {
		o := rankOrder(t, n, "train", 0, r)
		remaining = append(remaining, o.Indices[position:]...)
	}

	nodes[3].kill()
	testutil.AwaitWithin(t, 30*time.Second, "three members alive", func() bool {
		cl, err := nodes[0].c.Cluster(ctx)
		return err == nil && len(alive(cl)) == 3
	})
	resized, err := nodes[1].c.PutJob(ctx, api.Job{Name: "train", Dataset: "ds", Seed: 5, WorldSize: 3, BatchSize: batch, Ranks: names(nodes[:3])})
	if err != nil {
		t.Fatal(err)
	}
	if resized.Previous == nil || resized.Previous.Generation != old.Version || resized.Previous.WorldSize != 4 {
		t.Fatalf("resized job %+v: want generation %d with 4 ranks as its previous one", resized, old.Version)
	}

	seen := map[int]bool{}
	remote, share := 0, len(remaining)/3
	for r := range 3 {
		o, err := nodes[r].c.ResumedOrder(ctx, "train", 0, r, old.Version, position)
		if err != nil {
			t.Fatal(err)
		}
		again, err := nodes[(r+1)%3].c.ResumedOrder(ctx, "train", 0, r, old.Version, position)
		if err != nil || !slices.Equal(o.Indices, again.Indices) {
			t.Fatalf("rank %d: the resumed order differs between nodes (%v)", r, err)
		}
		if len(o.Indices) != share {
			t.Fatalf("rank %d: %d samples, want %d (of %d remaining, over 3 ranks)", r, len(o.Indices), share, len(remaining))
		}
		for _, i := range o.Indices {
			if seen[i] {
				t.Fatalf("sample %d given twice", i)
			}
			seen[i] = true
		}
		remote += o.Remote
	}
	// Each remaining sample exactly once, bar a tail of fewer than 3.
	missing := 0
	for _, i := range remaining {
		if !seen[i] {
			missing++
		}
	}
	if len(seen) != 3*share || missing != len(remaining)-3*share {
		t.Fatalf("%d samples resumed, %d of the %d remaining left out; want %d and %d (the tail)",
			len(seen), missing, len(remaining), 3*share, len(remaining)%3)
	}
	if fr := float64(remote) / float64(3*share); fr > 0.10 {
		t.Fatalf("%.1f%% of the resumed samples are remote, want at most 10%%", 100*fr)
	}
	t.Logf("resumed %d samples on 3 ranks, %d remote (%.1f%%), %d dropped", 3*share, remote, 100*float64(remote)/float64(3*share), len(remaining)%3)

	// The next epoch is a plain 3-rank epoch.
	next := 0
	for r := range 3 {
		o := rankOrder(t, nodes[r], "train", 1, r)
		if len(o.Indices) != items/3 {
			t.Fatalf("epoch 1 rank %d: %d samples, want %d", r, len(o.Indices), items/3)
		}
		next += o.Remote
	}
	if fr := float64(next) / float64(3*(items/3)); fr > 0.05 {
		t.Fatalf("epoch 1: %.1f%% remote, want at most 5%%", 100*fr)
	}

	// Generations other than the current one and the one it replaced, and
	// positions past the epoch, are refused.
	if _, err := nodes[0].c.ResumedOrder(ctx, "train", 0, 0, old.Version-1, position); !hasStatus(err, http.StatusConflict) {
		t.Fatalf("an unknown generation: %v, want 409", err)
	}
	if _, err := nodes[0].c.ResumedOrder(ctx, "train", 0, 0, old.Version, items); !hasStatus(err, http.StatusBadRequest) {
		t.Fatalf("a position past the epoch: %v, want 400", err)
	}
	if _, err := nodes[0].c.ResumedOrder(ctx, "train", 2, 0, old.Version, position); !hasStatus(err, http.StatusConflict) {
		t.Fatalf("an epoch never started under the old generation: %v, want 409", err)
	}
	cur, err := nodes[2].c.ResumedOrder(ctx, "train", 1, 2, resized.Version, 100)
	if full := rankOrder(t, nodes[2], "train", 1, 2); err != nil || !slices.Equal(cur.Indices, full.Indices[100:]) {
		t.Fatalf("resuming under the current generation: %v; want the rank's order from 100 on", err)
	}

	// After a leader change, the resumed orders are the same: they come from
	// the catalog alone. (The dead fourth voter is first removed from raft,
	// so two of the remaining three keep a quorum.)
	testutil.AwaitWithin(t, 60*time.Second, "the dead node out of the raft configuration", func() bool {
		cl, err := nodes[0].c.Cluster(ctx)
		if err != nil {
			return false
		}
		for _, m := range cl.Members {
			if m.Name == nodes[3].name && m.Raft != "" {
				return false
			}
		}
		return true
	})
	var want [3][]int
	for r := range 3 {
		o, err := nodes[r].c.ResumedOrder(ctx, "train", 0, r, old.Version, position)
		if err != nil {
			t.Fatal(err)
		}
		want[r] = o.Indices
	}
	cl, err := nodes[0].c.Cluster(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var rest []*proc
	for _, n := range nodes[:3] {
		if n.name == cl.Leader {
			n.kill()
		} else {
			rest = append(rest, n)
		}
	}
	if len(rest) != 2 {
		t.Fatalf("leader %q is not one of the three live nodes", cl.Leader)
	}
	testutil.AwaitWithin(t, 60*time.Second, "a new leader", func() bool {
		cl, err := rest[0].c.Cluster(ctx)
		return err == nil && slices.Contains(names(rest), cl.Leader)
	})
	for r := range 3 {
		for _, n := range rest {
			o, err := n.c.ResumedOrder(ctx, "train", 0, r, old.Version, position)
			if err != nil || !slices.Equal(o.Indices, want[r]) {
				t.Fatalf("rank %d from %s after the leader change: %v, or another order", r, n.name, err)
			}
		}
	}
}
