package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"stallfree/catalog"
	"stallfree/internal/testutil"
	"stallfree/membership"
)

// raftMember is a member as the reconciler sees it: gossip that advertises
// a raft address, and a catalog listening there (raft needs the voters it
// adds to answer).
type raftMember struct {
	ml   *membership.Membership
	cat  *catalog.Catalog
	raft string
}

func (m *raftMember) leave() {
	if m.ml != nil {
		m.ml.Leave(time.Second)
		m.ml = nil
	}
	if m.cat != nil {
		m.cat.Close()
		m.cat = nil
	}
}

// startRaftMember joins gossip at seed as name with a catalog of its own
// (not bootstrapped: it waits for the leader to add it).
func startRaftMember(t *testing.T, name, seed string, bootstrap bool) *raftMember {
	t.Helper()
	log := slog.New(slog.DiscardHandler)
	m := &raftMember{raft: testutil.FreeAddr(t)}
	// Raft's LAN timers, not the loopback ones: a leader that misses its
	// 150 ms lease on a loaded machine steps down, and these tests need the
	// one they drive to keep leading.
	cat, err := catalog.Open(catalog.Config{Key: testutil.ClusterKey(), NodeID: name, Bind: m.raft, Dir: t.TempDir(), Bootstrap: bootstrap, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	m.cat = cat
	var join []string
	bind := seed
	if !bootstrap {
		join, bind = []string{seed}, testutil.FreeAddr(t)
	}
	ml, err := membership.Join(membership.Config{Name: name, Bind: bind, Advertise: "127.0.0.1", Join: join, Timing: membership.LocalTiming(), Logger: log,
		Meta: membership.Meta{Incarnation: time.Now().UnixNano(), Raft: m.raft}})
	if err != nil {
		cat.Close()
		t.Fatal(err)
	}
	m.ml = ml
	t.Cleanup(m.leave)
	return m
}

// A Cluster whose reconciler only the test runs: the leader's catalog and
// gossip, and no watch loop (Start is not called), so each reconcileRaft is
// exactly one pass.
func reconcilerOnly(t *testing.T) (*Cluster, string) {
	t.Helper()
	gossip := testutil.FreeAddr(t)
	lead := startRaftMember(t, "c1", gossip, true)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := lead.cat.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "c1 to lead", lead.cat.IsLeader)
	c := New(Config{Name: "c1", DeadGrace: time.Nanosecond, Timing: LocalTiming(), Logger: slog.New(slog.DiscardHandler)}, &fakeLocal{}, lead.cat, nil)
	c.ml = lead.ml
	t.Cleanup(func() { c.vouch.close(); c.client.Close() })
	return c, gossip
}

// raftRoles maps each server in c's raft configuration to its address and
// whether it votes.
func raftRoles(t *testing.T, c *Cluster) map[string]catalog.Server {
	t.Helper()
	servers, err := c.cat.Servers()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]catalog.Server{}
	for _, s := range servers {
		out[s.ID] = s
	}
	return out
}

func voterCount(roles map[string]catalog.Server) int {
	n := 0
	for _, s := range roles {
		if s.Voter {
			n++
		}
	}
	return n
}

// One pass of the reconciler does all there is to do, however much changed
// since the last: five members that joined at once are all added, the
// voters counted as they are added (four voters and one non-voter beside
// the leader); a voter back under its name at a new raft address is
// removed and re-added there, still a voter (its old vote freed first); two
// members gone past their grace are both removed.
func TestReconcilerDoesAllInOnePass(t *testing.T) {
	c, gossip := reconcilerOnly(t)
	members := map[string]*raftMember{}
	for x := 2; x <= maxVoters+1; x++ {
		name := fmt.Sprintf("c%d", x)
		members[name] = startRaftMember(t, name, gossip, false)
	}
	testutil.Await(t, "six members in c1's gossip", func() bool { return len(c.ml.Alive()) == maxVoters+1 })
	if err := c.reconcileRaft(); err != nil {
		t.Fatal(err)
	}
	roles := raftRoles(t, c)
	if len(roles) != maxVoters+1 || voterCount(roles) != maxVoters {
		t.Fatalf("after one pass over six members: %v; want all six, %d voting", roles, maxVoters)
	}
	// A voter restarts: gone from gossip, back under its name at a new raft
	// address. Which member is the non-voter depends on gossip's order.
	var restarted string
	for name := range members {
		if roles[name].Voter {
			restarted = name
			break
		}
	}
	members[restarted].leave()
	testutil.Await(t, restarted+" to leave c1's gossip", func() bool { return goneFrom(c.ml, restarted) })
	back := startRaftMember(t, restarted, gossip, false)
	members[restarted] = back
	testutil.Await(t, restarted+" back at its new address in c1's gossip", func() bool {
		m, ok := c.ml.Get(restarted)
		return ok && m.State == membership.Alive && m.Meta.Raft == back.raft
	})
	if err := c.reconcileRaft(); err != nil {
		t.Fatal(err)
	}
	roles = raftRoles(t, c)
	if s := roles[restarted]; s.Address != back.raft || !s.Voter || len(roles) != maxVoters+1 || voterCount(roles) != maxVoters {
		t.Fatalf("after one pass over %s's restart: %v; want it a voter at %s, %d voters in all", restarted, roles, back.raft, maxVoters)
	}
	// Two other members go, the non-voter and a voter: one pass removes
	// both. (Two voters of five gone would leave exactly a quorum, one of
	// them the member just restarted: on a loaded machine the leader can
	// lose its lease mid-pass, which is raft doing its job, not this test's
	// subject.)
	var gone []string
	for name := range members {
		if !roles[name].Voter {
			gone = append(gone, name)
		}
	}
	for name := range members {
		if name != restarted && roles[name].Voter && len(gone) < 2 {
			gone = append(gone, name)
		}
	}
	if len(gone) != 2 {
		t.Fatalf("want the non-voter and a voter to stop, got %v of %v", gone, roles)
	}
	for _, name := range gone {
		members[name].leave()
	}
	testutil.Await(t, gone[0]+" and "+gone[1]+" to leave c1's gossip", func() bool {
		for _, name := range gone {
			if !goneFrom(c.ml, name) {
				return false
			}
		}
		return true
	})
	if err := c.reconcileRaft(); err != nil {
		t.Fatal(err)
	}
	// Only the two are checked: gossip may, for a moment, pass on the old
	// incarnation's death of the restarted member, which the pass then
	// rightly removes too.
	roles = raftRoles(t, c)
	for _, name := range gone {
		if _, in := roles[name]; in {
			t.Fatalf("after one pass, %s, gone past its grace, is still in raft: %v", name, roles)
		}
	}
}

// goneFrom reports whether ml records name as gone. Left or dead: a
// goodbye not delivered within Leave's timeout on a loaded host leaves the
// member to the failure detector, and the reconciler here (a grace of 1 ns)
// removes either.
func goneFrom(ml *membership.Membership, name string) bool {
	m, ok := ml.Get(name)
	return ok && (m.State == membership.Left || m.State == membership.Dead)
}

// records keeps the log records at warning level and above.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(_ context.Context, l slog.Level) bool { return l >= slog.LevelWarn }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.msgs = append(r.msgs, rec.Message)
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) all() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.msgs)
}

// The upkeep loop warns about a pass that failed, not about one that did
// its work: a warning in an operator's log has to mean something.
func TestUpkeepWarnsOnlyOfFailures(t *testing.T) {
	c, gossip := reconcilerOnly(t)
	logged := &records{}
	c.log = slog.New(logged)
	startRaftMember(t, "c2", gossip, false)
	testutil.Await(t, "c2 in c1's gossip", func() bool { return len(c.ml.Alive()) == 2 })
	kick := make(chan struct{}, 1)
	c.wg.Add(1)
	go c.upkeepRaft(kick)
	kick <- struct{}{}
	testutil.Await(t, "c2 in raft", func() bool { _, in := raftRoles(t, c)["c2"]; return in })
	close(c.stop)
	c.wg.Wait()
	if msgs := logged.all(); len(msgs) != 0 {
		t.Fatalf("a pass that added c2 logged %q", msgs)
	}
}
