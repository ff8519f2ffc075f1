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

// ActiveStallWindows is what this node heard from the ranks of every job
// that reported within the window, by job: every rank the book keeps (the
// other members judge stragglers over all of a job's ranks; only /metrics
// exports at most MaxRankSeries).
func (m MemorySplit) ActiveStallWindows() map[string][]split.RankWindow {
	return m.n.split.book.ActiveJobs(m.n.cfg.Name, split.DefaultMaxRanksTotal)
}

// stallWait bounds how long the other members' stall figures are waited
// for: a member that does not answer is left out, not waited for.
const stallWait = 2 * time.Second

// askMembers calls ask for every other live member at once, each with its
// HTTP address, under one stallWait deadline.
func (m MemorySplit) askMembers(ctx context.Context, ask func(ctx context.Context, name, addr string)) {
	n := m.n
	ctx, cancel := context.WithTimeout(ctx, stallWait)
	defer cancel()
	var wg sync.WaitGroup
	view := n.MemberView()
	for _, name := range view.Members() {
		addr, ok := view.MemberHTTP(name)
		if name == n.cfg.Name || !ok {
			continue
		}
		wg.Go(func() { ask(ctx, name, addr) })
	}
	wg.Wait()
}

// clusterStall is every member's windows of the jobs whose ranks report to
// this node, by job: one request per member, however many jobs (a member
// from before that route answers 404 and is asked job by job). Nothing is
// asked when no rank reports here.
func (m MemorySplit) clusterStall(ctx context.Context) map[string][]split.RankWindow {
	n := m.n
	all := m.ActiveStallWindows()
	if len(all) == 0 {
		return all
	}
	var mu sync.Mutex
	m.askMembers(ctx, func(ctx context.Context, name, addr string) {
		got := map[string][]split.RankWindow{}
		resp, err := n.ctl.Relay().JSON(ctx, http.MethodGet, addr, "/v1/internal/stall", nil, &got, nil, 64<<20)
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			got, err = m.askJobByJob(ctx, addr, all), nil
		}
		if err != nil {
			n.log.Debug("stall figures: a member did not answer", "member", name, "err", err)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		for job, ws := range got {
			if _, here := all[job]; here {
				all[job] = append(all[job], ws...)
			}
		}
	})
	return all
}

// askJobByJob asks a member for its windows of each of jobs, one request a
// job (the route of members from before /v1/internal/stall).
func (m MemorySplit) askJobByJob(ctx context.Context, addr string, jobs map[string][]split.RankWindow) map[string][]split.RankWindow {
	got := map[string][]split.RankWindow{}
	for job := range jobs {
		var ws []split.RankWindow
		path := "/v1/internal/jobs/" + url.PathEscape(job) + "/stall"
		if _, err := m.n.ctl.Relay().JSON(ctx, http.MethodGet, addr, path, nil, &ws, nil, 4<<20); err == nil {
			got[job] = ws
		}
	}
	return got
}

// JobStall is a job's per-rank stall figures, cluster-wide: what every live
// member heard from its ranks over the last minute, merged.
func (m MemorySplit) JobStall(ctx context.Context, job string) []api.RankStall {
	n := m.n
	windows := m.StallWindows(job)
	var mu sync.Mutex
	m.askMembers(ctx, func(ctx context.Context, name, addr string) {
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
	return split.MergeStall(windows, time.Now())
}

// MaxRankSeries bounds the (job, rank) pairs /metrics exports: past it, the
// jobs that reported least recently drop out.
const MaxRankSeries = 512

// rankCollector exports the stall figures of the ranks that report to this
// node (each rank's series come from one node), labelled by job and rank;
// stragglers are judged against the job's ranks cluster-wide.
type rankCollector struct {
	split MemorySplit
	node  string
	// The cluster's windows, fetched at most once per stallReuse: /metrics
	// needs no token, and each scrape asked every member once per job
	// (512 jobs: 512 requests per member and up to 2 s each).
	mu      sync.Mutex
	fetched time.Time
	windows map[string][]split.RankWindow
	fetch   func(context.Context) map[string][]split.RankWindow // split.clusterStall

	share     *prometheus.Desc
	step      *prometheus.Desc
	rate      *prometheus.Desc
	straggler *prometheus.Desc
}

func newRankCollector(m MemorySplit) *rankCollector {
	labels := []string{"job", "rank"}
	return &rankCollector{split: m, node: m.n.cfg.Name, fetch: m.clusterStall,
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

// stallReuse is how long one fetch of the cluster's windows serves scrapes.
const stallReuse = time.Second

// cluster returns the cluster's windows by job, fetched again only when the
// last fetch is older than stallReuse; scrapes at once share one fetch.
func (c *rankCollector) cluster() map[string][]split.RankWindow {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.windows == nil || time.Since(c.fetched) > stallReuse {
		c.windows, c.fetched = c.fetch(context.Background()), time.Now()
	}
	return c.windows
}

func (c *rankCollector) Collect(ch chan<- prometheus.Metric) {
	all := c.cluster()
	now := time.Now()
	// The jobs whose ranks report here, at most MaxRankSeries ranks.
	for job := range c.split.n.split.book.ActiveJobs(c.node, MaxRankSeries) {
		for _, r := range split.MergeStall(all[job], now) {
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
