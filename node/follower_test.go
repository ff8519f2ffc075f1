package node_test

// A real two-member cluster in one process: gossip, raft on disk, the peer
// transport and each node's HTTP API on loopback. It proves what a follower
// does with the leader (relayed writes it can read at once, epochs pinned
// through the leader) and what moves between members when one joins.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/internal/testcluster"
	"stallfree/internal/testutil"
	"stallfree/node"
)

// files is a dataset of count files of size bytes, each of a pattern of its
// own.
func files(t *testing.T, count, size int) (string, map[string][]byte) {
	t.Helper()
	out := map[string][]byte{}
	for i := range count {
		out[fmt.Sprintf("f%04d", i)] = bytes.Repeat([]byte{byte(i), byte(i >> 8), 0x5a}, size/3+1)[:size]
	}
	return testutil.WriteTree(t, out), out
}

func TestFollowerRelaysToTheLeader(t *testing.T) {
	ctx := context.Background()
	dir, data := files(t, 200, 300)
	tc := testcluster.New(t)
	a := tc.Add("a")
	if _, _, err := a.Control().PutDataset(ctx, "ds", dir); err != nil {
		t.Fatal(err)
	}
	d, err := a.Control().Dataset(ctx, "ds")
	if err != nil {
		t.Fatal(err)
	}
	// a alone owns and warms everything.
	a.StartWarmup(d)
	testutil.Await(t, "a's warm-up", func() bool { p := a.WarmupProgress(d); return !p.Running && p.Done == 200 })

	b := tc.Add("b")
	if b.Control().IsLeader() {
		t.Fatal("the joining member leads")
	}

	// A write made on the follower is relayed, and the follower reads it at once.
	dir2, _ := files(t, 5, 10)
	info, created, err := b.Control().PutDataset(ctx, "second", dir2)
	if err != nil || !created || info.Items != 5 {
		t.Fatalf("PutDataset on the follower: %+v %v %v", info, created, err)
	}
	if !b.Control().HasDataset("second") {
		t.Fatal("the follower does not see its own relayed write")
	}
	if _, _, err := b.Control().PutDataset(ctx, "second", dir); err == nil {
		t.Fatal("a conflicting source was accepted through the follower")
	} else if e := (*api.Error)(nil); !errors.As(err, &e) || e.Status != 409 {
		t.Fatalf("conflict through the follower: %v", err)
	}
	j, err := b.Control().PutJob(ctx, api.Job{Name: "j", Dataset: "ds", Seed: 4, WorldSize: 2, BatchSize: 8, Ranks: []string{"a", "b"}})
	if err != nil || j.Version == 0 || !b.Control().HasJob("j") {
		t.Fatalf("PutJob on the follower: %+v %v", j, err)
	}
	if got, err := b.Control().Job(ctx, "j"); err != nil || got.Version != j.Version {
		t.Fatalf("Job on the follower: %+v %v", got, err)
	}
	// The follower's first order pins the epoch through the leader; both
	// nodes then give each rank the same order.
	ob, err := b.Control().RankOrder(ctx, "j", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	oa, err := a.Control().RankOrder(ctx, "j", 0, 1)
	if err != nil || fmt.Sprint(oa.Indices) != fmt.Sprint(ob.Indices) {
		t.Fatalf("rank 1's order differs between the members: %v", err)
	}
	if err := b.Control().PinEpoch(ctx, "j", 1); err != nil {
		t.Fatalf("pin through the follower: %v", err)
	}
	if _, err := b.Control().Dataset(ctx, "nope"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("an unknown dataset on the follower: %v", err)
	}
	if err := b.Control().DeleteJob(ctx, "j"); err != nil || b.Control().HasJob("j") {
		t.Fatalf("DeleteJob on the follower: %v, still there %v", err, b.Control().HasJob("j"))
	}
	if err := b.Control().DeleteDataset(ctx, "second"); err != nil || b.Control().HasDataset("second") {
		t.Fatalf("DeleteDataset on the follower: %v", err)
	}

	// a's copies of what b owns now move to b; nothing is read from
	// storage again, and each item ends up once, at its owner.
	reads := a.Stats().SourceReads + b.Stats().SourceReads
	ownerOf := func(i int) string { o := a.Owners(d); return o.Members[o.Owners[i]].Name }
	atOwners := func() bool {
		if len(a.Owners(d).Members) != 2 {
			return false
		}
		for i := range 200 {
			if a.Split().Holds(d, i) != (ownerOf(i) == "a") || b.Split().Holds(d, i) != (ownerOf(i) == "b") {
				return false
			}
		}
		return true
	}
	testutil.Await(t, "each item held once, at its owner", atOwners)
	for i := range 200 {
		owner := ownerOf(i)
		it, err := b.Get(ctx, d, i)
		if err != nil || !bytes.Equal(it.Data, data[d.Manifest.Key(i)]) {
			t.Fatalf("item %d through b: %v", i, err)
		}
		if want := map[string]node.Cache{"a": node.Peer, "b": node.Hit}[owner]; it.Cache != want {
			t.Fatalf("item %d (owner %s) came to b as %s", i, owner, it.Cache)
		}
		it.Release()
	}
	if now := a.Stats().SourceReads + b.Stats().SourceReads; now != reads {
		t.Fatalf("%d storage reads after the join", now-reads)
	}
	cl := b.Cluster()
	if cl.Self != "b" || cl.Leader != "a" || len(cl.Members) != 2 {
		t.Fatalf("cluster %+v", cl)
	}
	for _, m := range cl.Members {
		if m.Raft != "voter" || m.State != "alive" {
			t.Fatalf("member %+v", m)
		}
	}
}
