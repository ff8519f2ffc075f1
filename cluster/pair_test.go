package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/cespare/xxhash/v2"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/internal/testutil"
	"stallfree/store"
)

// pairMember is one member of a two-member cluster started in this process:
// its own catalog (raft on disk), store, fake node and peer transport, all
// real and on loopback.
type pairMember struct {
	c     *Cluster
	cat   *catalog.Catalog
	st    *store.Store
	local *fakeLocal
}

// startPair starts c1 (which bootstraps raft and registers a dataset of n
// items) and returns it with a second member, c2, started by join once the
// test has set c1 up: c2 joins c1's gossip and c1's reconciler adds it to raft.
func startPair(t *testing.T, n, size int, httpAdvert string) (*pairMember, func(name string, opts ...func(*Config)) *pairMember, *catalog.Dataset) {
	t.Helper()
	return startPairWith(t, n, size, Config{HTTPAdvert: httpAdvert, DeadGrace: 300 * time.Millisecond})
}

// startPairWith is startPair with c1's HTTPAdvert and DeadGrace from cfg.
// join's opts set the joiner's Config before it starts.
func startPairWith(t *testing.T, n, size int, cfg Config) (*pairMember, func(name string, opts ...func(*Config)) *pairMember, *catalog.Dataset) {
	t.Helper()
	c1, d, st, local := oneMemberWith(t, n, size, cfg)
	first := &pairMember{c: c1, cat: c1.cat, st: st, local: local}
	gossip := c1.cfg.GossipBind
	join := func(name string, opts ...func(*Config)) *pairMember {
		t.Helper()
		// c1's raft may be named leader a moment before it acts as one; the
		// join must find it leading, so that adding c2 is its reconciler's doing.
		testutil.Await(t, "c1 to lead", c1.cat.IsLeader)
		log := slog.New(slog.DiscardHandler)
		raftAddr := testutil.FreeAddr(t)
		cat, err := catalog.Open(catalog.Config{Key: testutil.ClusterKey(), NodeID: name, Bind: raftAddr, Dir: t.TempDir(), Timing: catalog.LocalTiming(), Logger: log})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cat.Close() })
		st2, err := store.New(1<<20, store.MinIO{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st2.Close() })
		local2 := &fakeLocal{items: local.items}
		peer := testutil.FreeAddr(t)
		cfg2 := Config{Name: name, GossipBind: testutil.FreeAddr(t), Advertise: "127.0.0.1", PeerBind: peer, PeerAdvert: peer,
			RaftAdvert: raftAddr, Join: []string{gossip}, Timing: LocalTiming(), Logger: log}
		for _, o := range opts {
			o(&cfg2)
		}
		c2 := New(cfg2, local2, cat, st2)
		if err := c2.Start(); err != nil {
			t.Fatal(err)
		}
		second := &pairMember{c: c2, cat: cat, st: st2, local: local2}
		t.Cleanup(func() { second.close() })
		testutil.Await(t, name+" on both rings", func() bool {
			return slices.Contains(c1.Members(), name) && len(c2.Members()) == len(c1.Members()) && c2.Joined()
		})
		testutil.Await(t, "c2's catalog to hold the dataset", func() bool { _, ok := cat.Dataset("ds"); return ok })
		return second
	}
	return first, join, d
}

func (m *pairMember) close() {
	if m.c != nil {
		m.c.Close()
		m.c = nil
	}
}

// ownedBy lists the items of d the ring gives to name.
func ownedBy(c *Cluster, d *catalog.Dataset, name string) []int {
	var out []int
	for i := range d.Manifest.Len() {
		if owner, _ := c.Owner(d, i); owner == name {
			out = append(out, i)
		}
	}
	return out
}

// Two members: each asks the other for what it owns, alone and in batches,
// pushes reach their owner and are kept only there, a new owner takes over
// what the previous one held without a fill, the cluster view reads the
// other's figures, and a member that leaves is dropped from the ring and,
// after its grace, from raft.
func TestTwoMembers(t *testing.T) {
	const aHTTP = "127.0.0.1:7070" // what a advertises; nothing is asked of it
	a, join, d := startPair(t, 64, 100, aHTTP)
	ctx := context.Background()
	// a alone holds everything, as it would after a warm-up.
	for i := range 64 {
		if err := a.st.Put(store.MakeKey(d.ID, uint32(i)), a.local.items[i], xxhash.Sum64(a.local.items[i])); err != nil {
			t.Fatal(err)
		}
	}
	b := join("c2")
	for i := range 64 {
		oa, _ := a.c.Owner(d, i)
		ob, _ := b.c.Owner(d, i)
		if oa != ob {
			t.Fatalf("item %d: a says %s, b says %s", i, oa, ob)
		}
	}
	ofA, ofB := ownedBy(b.c, d, "c1"), ownedBy(b.c, d, "c2")
	if len(ofA) == 0 || len(ofB) == 0 {
		t.Fatalf("a owns %d, b %d: pick another item count", len(ofA), len(ofB))
	}

	// The previous owner's copy moves to the new one without a fill.
	for _, i := range ofB {
		f, ok := b.c.Handoff(ctx, d, i)
		if !ok || string(f.Data) != string(a.local.items[i]) || !b.st.Contains(store.MakeKey(d.ID, uint32(i))) {
			t.Fatalf("handoff of item %d: %v", i, ok)
		}
	}
	if a.local.fills != 0 || b.local.fills != 0 {
		t.Fatalf("handoffs made %d + %d fills", a.local.fills, b.local.fills)
	}

	// One at a time and in a batch, from the owner's memory.
	for _, i := range ofA[:3] {
		f, ok := b.c.FromOwner(ctx, "c1", d, i)
		if !ok || string(f.Data) != string(a.local.items[i]) || f.Sum != xxhash.Sum64(f.Data) {
			t.Fatalf("item %d from its owner: %v", i, ok)
		}
	}
	all := make([]int, 64)
	for i := range all {
		all[i] = i
	}
	got, found := b.c.FromOwners(ctx, d, all)
	for i := range 64 {
		owner, _ := b.c.Owner(d, i)
		if found[i] != (owner == "c1") || found[i] && string(got[i].Data) != string(a.local.items[i]) {
			t.Fatalf("item %d (owner %s) in the batch: found %v", i, owner, found[i])
		}
	}
	if a.local.fills != 0 {
		t.Fatalf("%d fills for items a holds", a.local.fills)
	}
	wantIn := uint64(100 * (len(ofB) + 3 + len(ofA)))
	if st := b.c.Stats(); st.PeerBytesIn != wantIn || st.PeerFailures != 0 {
		t.Fatalf("b's stats %+v; want %d bytes in, no failure", st, wantIn)
	}

	// A push is kept by the owner, refused for what it does not own.
	a.st.Delete(store.MakeKey(d.ID, uint32(ofA[0])))
	kept, err := b.c.PushToOwner(ctx, "c1", d, []int{ofA[0], ofB[0]}, [][]byte{a.local.items[ofA[0]], a.local.items[ofB[0]]})
	if err != nil || len(kept) != 2 || !kept[0] || kept[1] {
		t.Fatalf("push: %v %v; want the first kept, the second not", kept, err)
	}
	if !a.st.Contains(store.MakeKey(d.ID, uint32(ofA[0]))) {
		t.Fatal("a does not hold what it kept")
	}
	if st := b.c.Stats(); st.PeerBytesOut != 200 {
		t.Fatalf("b's bytes out %d, want 200", st.PeerBytesOut)
	}

	// Asking a member that does not exist is a failure, not a wait.
	if _, ok := b.c.FromOwner(ctx, "nobody", d, 0); ok {
		t.Fatal("a fetch from no member succeeded")
	}
	if _, err := b.c.PushToOwner(ctx, "nobody", d, []int{0}, [][]byte{a.local.items[0]}); err == nil {
		t.Fatal("a push to no member succeeded")
	}
	if st := b.c.Stats(); st.PeerFailures != 1 {
		t.Fatalf("%d peer failures, want 1", st.PeerFailures)
	}

	// b's view of the cluster asks a for its figures over the peer
	// transport: they are what a's store holds.
	aHolds := a.st.Stats()
	if aHolds.Items == 0 || aHolds.Bytes == 0 {
		t.Fatalf("a holds %+v: nothing to show", aHolds)
	}
	view := b.c.Describe(api.Member{Name: "c2", State: "alive"})
	if len(view) != 2 {
		t.Fatalf("view %+v", view)
	}
	var share float64
	for _, m := range view {
		share += m.Share
		if m.Name == "c1" && (m.Items != aHolds.Items || m.Bytes != aHolds.Bytes || m.State != "alive" || m.HTTP != aHTTP) {
			t.Fatalf("a as b sees it: %+v", m)
		}
	}
	if share < 0.999 || share > 1.001 {
		t.Fatalf("shares sum to %v", share)
	}
	if addr, ok := b.c.HTTPAddr("c1"); !ok || addr != aHTTP {
		t.Fatalf("a's HTTP address: %q %v", addr, ok)
	}
	if _, ok := b.c.HTTPAddr("c2"); ok {
		t.Fatal("b advertised an HTTP address it was not given")
	}

	// Raft: a's reconciler made b a voter; once b leaves it is dropped from
	// the ring and, after the grace, from raft.
	voter := func(id string) (in, isVoter bool) {
		servers, err := a.cat.Servers()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range servers {
			if s.ID == id {
				return true, s.Voter
			}
		}
		return false, false
	}
	testutil.Await(t, "b to become a raft voter", func() bool { _, v := voter("c2"); return v })
	b.close()
	testutil.Await(t, "a's ring to drop b", func() bool { return len(a.c.Members()) == 1 })
	testutil.Await(t, "raft to drop b", func() bool { in, _ := voter("c2"); return !in })
}

// The reconciler keeps raft's voters at maxVoters however many members
// join: the rest replicate the catalog as non-voters, so a quorum stays
// small and quick.
func TestRaftKeepsAtMostFiveVoters(t *testing.T) {
	a, join, _ := startPair(t, 4, 10, "")
	for x := range maxVoters {
		join(fmt.Sprintf("c%d", x+2))
	}
	roles := func() (voters, others int) {
		servers, err := a.cat.Servers()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range servers {
			if s.Voter {
				voters++
			} else {
				others++
			}
		}
		return voters, others
	}
	testutil.Await(t, "every member in raft", func() bool { v, o := roles(); return v+o == maxVoters+1 })
	if v, o := roles(); v != maxVoters || o != 1 {
		t.Fatalf("%d voters and %d non-voters among %d members, want %d and 1", v, o, maxVoters+1, maxVoters)
	}
}

// A member that comes back under its name with a new raft address (a
// container restarted) is re-added at the new address while its old entry
// would still be kept for the dead-member grace.
func TestRestartedMemberIsReAddedAtItsNewAddress(t *testing.T) {
	a, join, _ := startPairWith(t, 4, 10, Config{DeadGrace: time.Hour})
	raftAddr := func(id string) string {
		servers, err := a.cat.Servers()
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range servers {
			if s.ID == id {
				return s.Address
			}
		}
		return ""
	}
	b := join("c2")
	testutil.Await(t, "c2 in raft", func() bool { return raftAddr("c2") != "" })
	first := raftAddr("c2")
	b.close()
	testutil.Await(t, "c1's ring to drop c2", func() bool { return len(a.c.Members()) == 1 })
	join("c2")
	testutil.Await(t, "c2 at its new address", func() bool { a := raftAddr("c2"); return a != "" && a != first })
}
