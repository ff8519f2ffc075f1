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
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/httpapi"
	"stallfree/node"
)

// member starts a clustered node behind its HTTP API; join is the gossip
// address of a member to join ("" bootstraps a new cluster).
func member(t *testing.T, name, join string) (*node.Node, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	peer := node.FreeAddr(t)
	cfg := node.Config{Name: name, HTTPAdvert: ln.Addr().String(), PeerAdvert: peer, PeerBind: peer, RaftBind: node.FreeAddr(t),
		DataDir: t.TempDir(), Bootstrap: join == "", Memory: 64 << 20, Policy: "lru", FastRaft: true,
		Logger: slog.New(slog.DiscardHandler), GossipBind: node.FreeAddr(t), Advertise: "127.0.0.1"}
	if join != "" {
		cfg.Join = []string{join}
	}
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
	return n, cfg.GossipBind
}

func files(t *testing.T, count, size int) (string, map[string][]byte) {
	t.Helper()
	dir := t.TempDir()
	out := map[string][]byte{}
	for i := range count {
		b := bytes.Repeat([]byte{byte(i), byte(i >> 8), 0x5a}, size/3+1)[:size]
		name := fmt.Sprintf("f%04d", i)
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
		out[name] = b
	}
	return dir, out
}

func TestFollowerRelaysToTheLeader(t *testing.T) {
	ctx := context.Background()
	dir, data := files(t, 200, 300)
	a, gossip := member(t, "a", "")
	node.Await(t, "a to lead", a.IsLeader)
	if _, _, err := a.PutDataset(ctx, "ds", dir); err != nil {
		t.Fatal(err)
	}
	d, err := a.Dataset(ctx, "ds")
	if err != nil {
		t.Fatal(err)
	}
	// a alone owns and warms everything.
	a.StartWarmup(d)
	node.Await(t, "a's warm-up", func() bool { p := a.WarmupProgress(d); return !p.Running && p.Done == 200 })

	b, _ := member(t, "b", gossip)
	node.Await(t, "b to be ready", func() bool { ok, _ := b.Ready(); return ok && b.LeaderHTTP() != "" })
	if b.IsLeader() {
		t.Fatal("the joining member leads")
	}

	// A write made on the follower is relayed, and the follower reads it at once.
	dir2, _ := files(t, 5, 10)
	info, created, err := b.PutDataset(ctx, "second", dir2)
	if err != nil || !created || info.Items != 5 {
		t.Fatalf("PutDataset on the follower: %+v %v %v", info, created, err)
	}
	if !b.HasDataset("second") {
		t.Fatal("the follower does not see its own relayed write")
	}
	if _, _, err := b.PutDataset(ctx, "second", dir); err == nil {
		t.Fatal("a conflicting source was accepted through the follower")
	} else if e := (*api.Error)(nil); !errors.As(err, &e) || e.Status != 409 {
		t.Fatalf("conflict through the follower: %v", err)
	}
	j, err := b.PutJob(ctx, api.Job{Name: "j", Dataset: "ds", Seed: 4, WorldSize: 2, BatchSize: 8, Ranks: []string{"a", "b"}})
	if err != nil || j.Version == 0 || !b.HasJob("j") {
		t.Fatalf("PutJob on the follower: %+v %v", j, err)
	}
	if got, err := b.Job(ctx, "j"); err != nil || got.Version != j.Version {
		t.Fatalf("Job on the follower: %+v %v", got, err)
	}
	// The follower's first order pins the epoch through the leader; both
	// nodes then give each rank the same order.
	ob, err := b.RankOrder(ctx, "j", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	oa, err := a.RankOrder(ctx, "j", 0, 1)
	if err != nil || fmt.Sprint(oa.Indices) != fmt.Sprint(ob.Indices) {
		t.Fatalf("rank 1's order differs between the members: %v", err)
	}
	if err := b.PinEpoch(ctx, "j", 1); err != nil {
		t.Fatalf("pin through the follower: %v", err)
	}
	if _, err := b.Dataset(ctx, "nope"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("an unknown dataset on the follower: %v", err)
	}
	if err := b.DeleteJob(ctx, "j"); err != nil || b.HasJob("j") {
		t.Fatalf("DeleteJob on the follower: %v, still there %v", err, b.HasJob("j"))
	}
	if err := b.DeleteDataset(ctx, "second"); err != nil || b.HasDataset("second") {
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
			if a.Holds(d, i) != (ownerOf(i) == "a") || b.Holds(d, i) != (ownerOf(i) == "b") {
				return false
			}
		}
		return true
	}
	node.Await(t, "each item held once, at its owner", atOwners)
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
