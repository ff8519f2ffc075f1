package integration

import (
	"context"
	"testing"
	"time"

	"stallfree/internal/testutil"
)

// leaderAndRest is the node among nodes that leads raft as nodes[0] sees it.
func leaderAndRest(t *testing.T, nodes []*proc) (leader *proc, rest []*proc) {
	t.Helper()
	var name string
	testutil.AwaitWithin(t, 30*time.Second, "a leader", func() bool {
		cl, err := nodes[0].c.Cluster(context.Background())
		name = cl.Leader
		return err == nil && name != ""
	})
	for _, n := range nodes {
		if n.name == name {
			leader = n
		} else {
			rest = append(rest, n)
		}
	}
	if leader == nil {
		t.Fatalf("leader %q is none of the nodes", name)
	}
	return leader, rest
}

// cleanStop stops n with SIGTERM and checks that it left raft: the nodes
// that stay no longer count it as a voter, one of them leads, and a catalog
// write through each of them succeeds at once (no 35 s wait for a quorum
// that cannot form, as when a stopped node stayed a voter).
func cleanStop(t *testing.T, n *proc, stay []*proc, dataset, dir string) {
	t.Helper()
	n.stop()
	for _, s := range stay {
		if role := raftRole(s, n.name); role != "" {
			t.Fatalf("%s still sees %s in raft (%q) after its clean stop", s.name, n.name, role)
		}
	}
	testutil.AwaitWithin(t, 10*time.Second, "a leader among "+names(stay)[0]+"…", func() bool {
		cl, err := stay[0].c.Cluster(context.Background())
		return err == nil && cl.Leader != "" && cl.Leader != n.name
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, s := range stay {
		if _, err := s.c.PutDataset(ctx, dataset+"-"+s.name, dir); err != nil {
			t.Fatalf("registering through %s after %s stopped cleanly: %v", s.name, n.name, err)
		}
	}
}

// rejoin restarts n with the command line it was first started with and
// waits until it is a voter again, as seen from seed. The node that
// bootstrapped has no --join: it joins the members its clean leave recorded
// (LEFT in its data dir), not refuse to start on a configuration without it.
func rejoin(t *testing.T, n, seed *proc, all []*proc) {
	t.Helper()
	n.start()
	waitMembers(t, all, names(all))
	testutil.AwaitWithin(t, 30*time.Second, n.name+" a voter again", func() bool { return raftRole(seed, n.name) == "voter" })
}

// Issue 47: a node stopped cleanly (SIGTERM) leaves raft's voters before it
// exits, so a two-node cluster keeps a leader and its catalog writes; a
// restart joins again. Both ways round: the follower stops, then the leader.
func TestCleanStopKeepsTwoNodesWritable(t *testing.T) {
	testutil.Long(t)
	dir, _ := dataset(t, 4, 100)
	nodes := startCluster(t, clusterOpts{nodes: 2})
	testutil.AwaitWithin(t, 30*time.Second, "two voters", func() bool {
		return raftRole(nodes[0], "n1") == "voter" && raftRole(nodes[0], "n2") == "voter"
	})
	leader, rest := leaderAndRest(t, nodes)
	follower := rest[0]
	cleanStop(t, follower, []*proc{leader}, "a", dir)
	rejoin(t, follower, leader, nodes)

	leader, rest = leaderAndRest(t, nodes)
	cleanStop(t, leader, rest, "b", dir)
	rejoin(t, leader, rest[0], nodes)
}

// With three nodes, two clean stops in a row leave the third leading alone;
// both come back as voters.
func TestCleanStopsLeaveThreeNodesToOne(t *testing.T) {
	testutil.Long(t)
	dir, _ := dataset(t, 4, 100)
	nodes := startCluster(t, clusterOpts{nodes: 3})
	testutil.AwaitWithin(t, 30*time.Second, "three voters", func() bool {
		for _, n := range names(nodes) {
			if raftRole(nodes[0], n) != "voter" {
				return false
			}
		}
		return true
	})
	leader, rest := leaderAndRest(t, nodes)
	cleanStop(t, leader, rest, "a", dir)
	cleanStop(t, rest[0], rest[1:], "b", dir)
	last := rest[1]
	if cl := mustCluster(t, last); cl.Leader != last.name {
		t.Fatalf("the last node does not lead alone: leader %q", cl.Leader)
	}
	rejoin(t, leader, last, []*proc{leader, last})
	rejoin(t, rest[0], last, nodes)
}
