package integration

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"stallfree/internal/testutil"
)

// Three cachenode processes configured as the StatefulSet's pods are
// (deploy/kubernetes/base): named stallfree-0..2, the bootstrap rule from
// STALLFREE_BOOTSTRAP_ORDINAL_ZERO, every pod given the same --join of host
// names, the joiners started first (podManagementPolicy: Parallel). No
// joiner forms a cluster of its own; one cluster forms once ordinal 0 is
// up; ordinal 0 restarted on its data dir comes back as the member it was
// instead of founding a second cluster. (The pods' DNS name that resolves
// to many addresses is node's TestPodsJoinThroughANameOfManyAddresses.)
func TestStatefulSetBootstrapRule(t *testing.T) {
	testutil.Long(t)
	names := []string{"stallfree-0", "stallfree-1", "stallfree-2"}
	var gossip, join []string
	for range names {
		addr := testutil.FreeAddrOn(t, "127.0.0.1")
		gossip = append(gossip, addr)
		join = append(join, "localhost:"+addr[len("127.0.0.1:"):])
	}
	env := []string{"STALLFREE_BOOTSTRAP_ORDINAL_ZERO=true"}
	pod := func(i int) *proc {
		// info: the node logs the rule's decision.
		return startNode(t, nodeOpts{name: names[i], gossip: gossip[i], join: join, env: env, logLevel: "info"})
	}
	p2, p1 := pod(2), pod(1)
	// They find each other, but neither may bootstrap: no leader, not ready.
	testutil.AwaitWithin(t, 30*time.Second, "the joiners to see each other", func() bool {
		cl, err := p1.c.Cluster(context.Background())
		return err == nil && slices.Equal(alive(cl), names[1:])
	})
	for _, p := range []*proc{p1, p2} {
		if cl := mustCluster(t, p); cl.Leader != "" {
			t.Fatalf("%s follows %s before ordinal 0 is up: a joiner bootstrapped", p.name, cl.Leader)
		}
	}
	p0 := pod(0)
	nodes := []*proc{p0, p1, p2}
	waitMembers(t, nodes, names)
	threeVoters := func() bool {
		leaders := map[string]bool{}
		for _, n := range nodes {
			cl, err := n.c.Cluster(context.Background())
			if err != nil {
				return false
			}
			voters := 0
			for _, m := range cl.Members {
				if m.State == "alive" && m.Raft == "voter" {
					voters++
				}
			}
			if voters != 3 {
				return false
			}
			leaders[cl.Leader] = true
		}
		return len(leaders) == 1
	}
	testutil.AwaitWithin(t, 30*time.Second, "one cluster of three voters", threeVoters)

	dir, _ := dataset(t, 20, 500)
	if _, err := p2.c.PutDataset(context.Background(), "ds", dir); err != nil {
		t.Fatal(err)
	}
	// Ordinal 0 restarts with its data dir: it must rejoin, not bootstrap anew.
	p0.stop()
	p0.start()
	waitMembers(t, nodes, names)
	testutil.AwaitWithin(t, 30*time.Second, "one cluster of three voters after ordinal 0 restarted", threeVoters)
	waitReady(t, p0)
	// A restarted follower may answer ready before the leader's next append
	// tells it the commit index (TestRestartedFollowerNeverAnswers404), so
	// its own listing is awaited: a second cluster would never list it.
	testutil.AwaitWithin(t, 30*time.Second, "ordinal 0 to list the cluster's dataset after its restart", func() bool {
		ds, err := p0.c.Datasets(context.Background())
		return err == nil && len(ds) == 1 && ds[0].Name == "ds" && ds[0].Items == 20
	})
	if d, err := p0.c.Dataset(context.Background(), "ds"); err != nil || d.Items != 20 {
		t.Fatalf("ordinal 0 answers for the dataset with %+v, %v", d, err)
	}

	// Empty clusters founded side by side can merge, so the outcome alone
	// would not show a joiner that bootstrapped: each node says what it
	// decided (read once it has exited, when its log is complete).
	for i, p := range []*proc{p0, p1, p2} {
		p.stop()
		want := fmt.Sprintf("bootstrap=%t", i == 0)
		if !strings.Contains(p.log.String(), "StatefulSet rule") || !strings.Contains(p.log.String(), want) {
			t.Errorf("%s did not log the StatefulSet rule with %s", p.name, want)
		}
	}
}
