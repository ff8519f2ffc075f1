package node

import (
	"maps"

	"github.com/prometheus/client_golang/prometheus"

	"stallfree/membership"
)

// opsCollector exports what an operator's dashboard and alerts watch
// (deploy/grafana, deploy/prometheus): members by state, this node's
// warm-up progress per dataset, and raft leadership changes.
type opsCollector struct {
	n             *Node
	leaderChanges func() uint64
	members       *prometheus.Desc
	leaders       *prometheus.Desc
	warmDone      *prometheus.Desc
	warmTotal     *prometheus.Desc
}

func newOpsCollector(n *Node) *opsCollector {
	return &opsCollector{n: n, leaderChanges: n.cat.CountLeaderChanges(),
		members: prometheus.NewDesc("stallfree_members", "Members this node's gossip knows, by state (alive, suspect, dead, left).", []string{"state"}, nil),
		leaders: prometheus.NewDesc("stallfree_raft_leader_changes_total", "Times this member saw a new raft leader since it started.", nil, nil),
		warmDone: prometheus.NewDesc("stallfree_warmup_done_items", "Items of this node's share of a dataset its last warm-up has read.",
			[]string{"dataset"}, nil),
		warmTotal: prometheus.NewDesc("stallfree_warmup_total_items", "Items in this node's share of a dataset its last warm-up reads.",
			[]string{"dataset"}, nil),
	}
}

func (c *opsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.members
	ch <- c.leaders
	ch <- c.warmDone
	ch <- c.warmTotal
}

func (c *opsCollector) Collect(ch chan<- prometheus.Metric) {
	byState := c.n.peers.Stats().Members
	if len(byState) == 0 { // a node on its own
		byState = map[string]int{string(membership.Alive): 1}
	}
	for _, st := range []membership.State{membership.Alive, membership.Suspect, membership.Dead, membership.Left} {
		ch <- prometheus.MustNewConstMetric(c.members, prometheus.GaugeValue, float64(byState[string(st)]), string(st))
	}
	ch <- prometheus.MustNewConstMetric(c.leaders, prometheus.CounterValue, float64(c.leaderChanges()))
	c.n.mu.Lock()
	warmups := maps.Clone(c.n.warmups)
	c.n.mu.Unlock()
	for name, w := range warmups {
		p := w.progress()
		ch <- prometheus.MustNewConstMetric(c.warmDone, prometheus.GaugeValue, float64(p.Done), name)
		ch <- prometheus.MustNewConstMetric(c.warmTotal, prometheus.GaugeValue, float64(p.Total), name)
	}
}
