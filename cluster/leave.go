package cluster

import (
	"context"
	"fmt"
	"time"

	"stallfree/membership"
)

// leavePoll is how often a leaving node looks whether the configuration
// without it has reached it. Raft offers no follower-side event for
// configuration changes, so this is a poll, bounded by Leave's context.
const leavePoll = 20 * time.Millisecond

// Leave takes this node out of the cluster before it stops cleanly
// (SIGTERM), as Consul's leave does: first gossip, so the others see it
// left rather than failed, then raft's voters, so the members that stay keep
// a quorum without it. A stopped node left in the voters would keep a
// two-node cluster from ever electing a leader until it came back.
//
// A follower only leaves gossip: the leader's reconciler removes a member
// that left at once (reconcileRaft), and raft replicates the configuration
// entry to the removed node before it stops replicating to it, so this node
// sees itself gone. A leader first hands the lead to another voter, which
// then removes it the same way and needs no election timeout; when no voter
// can take it, the leader removes itself and the others elect one.
//
// The only voter keeps its place: raft cannot commit without a voter, and a
// restart must find the cluster it left. Leave returns once the
// configuration here no longer holds this node as a voter, or when ctx ends
// (the others unreachable: the node stops anyway, as after a crash).
func (c *Cluster) Leave(ctx context.Context) error {
	// The members to come back to, taken before gossip stops.
	var seeds []string
	for _, m := range c.ml.Members() {
		if m.Name != c.cfg.Name && m.State == membership.Alive && m.Addr != "" {
			seeds = append(seeds, m.Addr)
		}
	}
	c.leaveGossip()
	t := time.NewTicker(leavePoll)
	defer t.Stop()
	transferred := false
	for {
		servers, err := c.cat.Servers()
		if err != nil {
			return fmt.Errorf("leaving raft: %w", err)
		}
		voter, others := false, 0
		for _, s := range servers {
			if s.ID == c.cfg.Name {
				voter = s.Voter
			} else if s.Voter {
				others++
			}
		}
		if !voter || others == 0 {
			if voter {
				c.log.Info("leaving: the only raft voter keeps its place")
				return nil
			}
			c.log.Info("left the raft configuration")
			if err := c.cat.MarkLeft(seeds); err != nil {
				return fmt.Errorf("left raft, but a restart with --bootstrap will not know: %w", err)
			}
			return nil
		}
		if c.cat.IsLeader() {
			if transferred {
				// The lead came back (the new leader lost it at once):
				// remove this node from here instead.
				if err := c.cat.RemoveServer(c.cfg.Name); err != nil {
					return fmt.Errorf("leaving raft: removing this node as leader: %w", err)
				}
				continue
			}
			transferred = true
			if err := c.cat.TransferLeadership(); err != nil {
				c.log.Info("leaving: no voter took the lead; removing this node as leader", "err", err)
				if err := c.cat.RemoveServer(c.cfg.Name); err != nil {
					return fmt.Errorf("leaving raft: removing this node as leader: %w", err)
				}
			}
			continue
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("leaving raft: still a voter: %w", ctx.Err())
		case <-t.C:
		}
	}
}

// leaveGossip tells the other members this node is going, once: Leave and
// Close both end with it.
func (c *Cluster) leaveGossip() {
	c.leaveOnce.Do(func() {
		if err := c.ml.Leave(time.Second); err != nil {
			c.log.Debug("leaving gossip", "err", err)
		}
	})
}
