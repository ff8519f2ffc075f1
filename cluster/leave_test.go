package cluster

import (
	"context"
	"testing"
	"time"

	"stallfree/internal/testutil"
)

// voters lists the voters in cat's raft configuration, by name.
func voters(t *testing.T, m *pairMember) map[string]bool {
	t.Helper()
	servers, err := m.cat.Servers()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, s := range servers {
		if s.Voter {
			out[s.ID] = true
		}
	}
	return out
}

// A member that leaves cleanly is out of raft's voters when Leave returns,
// long before a dead member's grace (an hour here) would remove it, and the
// one that stays leads alone and commits a catalog write. Both ways round:
// the follower leaving, and the leader, which hands its lead over first.
func TestCleanLeaveRemovesTheVoter(t *testing.T) {
	for _, leaderLeaves := range []bool{false, true} {
		name := "follower leaves"
		if leaderLeaves {
			name = "leader leaves"
		}
		t.Run(name, func(t *testing.T) {
			c1, join, _ := startPairWith(t, 4, 16, Config{DeadGrace: time.Hour})
			c2 := join("c2")
			testutil.Await(t, "c2 a voter", func() bool { return voters(t, c1)["c2"] && voters(t, c2)["c2"] })
			leaving, staying := c2, c1
			if leaderLeaves {
				leaving, staying = c1, c2
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if err := leaving.c.Leave(ctx); err != nil {
				t.Fatalf("Leave: %v", err)
			}
			if v := voters(t, leaving); v[leaving.c.cfg.Name] {
				t.Fatalf("after Leave the leaving node still sees itself a voter: %v", v)
			}
			testutil.Await(t, "the staying node to lead alone", staying.cat.IsLeader)
			if v := voters(t, staying); len(v) != 1 || !v[staying.c.cfg.Name] {
				t.Fatalf("voters on the staying node: %v; want only itself", v)
			}
			if _, _, err := staying.cat.DeriveDataset("after-leave", "ds", "s"); err != nil {
				t.Fatalf("a catalog write after the clean leave: %v", err)
			}
		})
	}
}

// The only voter keeps its place: removing it would leave a configuration
// nobody can lead, and its restart must find the cluster it had.
func TestOnlyVoterKeepsItsPlaceOnLeave(t *testing.T) {
	c1, _, _ := startPairWith(t, 4, 16, Config{DeadGrace: time.Hour})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c1.c.Leave(ctx); err != nil {
		t.Fatalf("Leave: %v", err)
	}
	if v := voters(t, c1); !v["c1"] {
		t.Fatalf("the only voter removed itself: %v", v)
	}
}
