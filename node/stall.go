package node

import (
	"context"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"stallfree/api"
	"stallfree/split"
)

// StallWindows is what this node heard from each rank of job over the last
// minute (the internal stall route; JobStall merges every node's).
func (m MemorySplit) StallWindows(job string) []split.RankWindow {
	w := m.n.split.book.Recent(job, m.n.cfg.Name)
	if w == nil {
		w = []split.RankWindow{}
	}
	return w
}

// stallWait bounds how long the other members' stall figures are waited
// for: a member that does not answer is left out, not waited for.
const stallWait = 2 * time.Second

// JobStall is a job's per-rank stall figures, cluster-wide: what every live
// member heard from its ranks over the last minute, merged.
func (m MemorySplit) JobStall(ctx context.Context, job string) []api.RankStall {
	n := m.n
	windows := m.StallWindows(job)
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	ctx, cancel := context.WithTimeout(ctx, stallWait)
	defer cancel()
	view := n.MemberView()
	for _, name := range view.Members() {
		addr, ok := view.MemberHTTP(name)
		if name == n.cfg.Name || !ok {
			continue
		}
		wg.Go(func() {
			var got []split.RankWindow
			path := "/v1/internal/jobs/" + url.PathEscape(job) + "/stall"
			if _, err := n.ctl.Relay().JSON(ctx, http.MethodGet, addr, path, nil, &got, nil, 4<<20); err != nil {
				n.log.Debug("stall figures: a member did not answer", "member", name, "err", err)
				return
			}
			mu.Lock()
			windows = append(windows, got...)
			mu.Unlock()
		})
	}
	wg.Wait()
	return split.MergeStall(windows, time.Now())
}

// MaxRankSeries bounds the (job, rank) pairs /metrics exports: past it, the
// jobs that reported least recently drop out.
const MaxRankSeries = 512

// rankCollector exports the stall figures of the ranks that report to this
// node (each rank's series come from one node), labelled by job and rank;
// stragglers are judged against the job's ranks cluster-wide.
type rankCollector struct {
	split     MemorySplit
	book      *split.Book
	node      string
	share     *prometheus.Desc
	step      *prometheus.Desc
	rate      *prometheus.Desc
	straggler *prometheus.Desc
}

func newRankCollector(m MemorySplit) *rankCollector {
	labels := []string{"job", "rank"}
	return &rankCollector{split: m, book: m.n.split.book, node: m.n.cfg.Name,
		share: prometheus.NewDesc("stallfree_rank_wait_share", "Share of the last minute a rank's loop waited for data.", labels, nil),
		step:  prometheus.NewDesc("stallfree_rank_step_seconds", "A rank's mean step time per batch over the last minute.", labels, nil),
		rate:  prometheus.NewDesc("stallfree_rank_samples_per_second", "Samples per second a rank consumed over the last minute.", labels, nil),
		straggler: prometheus.NewDesc("stallfree_rank_straggler",
			"1 when a rank's step time is over 1.2x the median of its job's ranks (as this node heard them).", labels, nil),
	}
}

func (c *rankCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.share
	ch <- c.step
	ch <- c.rate
	ch <- c.straggler
}

func (c *rankCollector) Collect(ch chan<- prometheus.Metric) {
	for job := range c.book.ActiveJobs(c.node, MaxRankSeries) {
		for _, r := range c.split.JobStall(context.Background(), job) {
			if r.Node != c.node {
				continue // another node exports it
			}
			rank := strconv.Itoa(r.Rank)
			straggler := 0.0
			if r.Straggler {
				straggler = 1
			}
			ch <- prometheus.MustNewConstMetric(c.share, prometheus.GaugeValue, r.WaitShare, job, rank)
			ch <- prometheus.MustNewConstMetric(c.step, prometheus.GaugeValue, r.StepS, job, rank)
			ch <- prometheus.MustNewConstMetric(c.rate, prometheus.GaugeValue, r.SamplesPerS, job, rank)
			ch <- prometheus.MustNewConstMetric(c.straggler, prometheus.GaugeValue, straggler, job, rank)
		}
	}
}
