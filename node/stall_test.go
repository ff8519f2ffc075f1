package node

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"stallfree/split"
)

// A scrape of /metrics (no token needed) fetches the cluster's stall windows
// once for all jobs, and scrapes within stallReuse share that fetch: each
// scrape used to ask every member once per job that reported.
func TestStallScrapesShareOneFetch(t *testing.T) {
	n, _, _ := startNode(t, 4, 64, 1<<20, false)
	for _, job := range []string{"a", "b", "c"} {
		n.split.book.Add(split.Report{Job: job, Rank: 0, WaitS: 1, StepS: 3, Batches: 2, Items: 8}, 0)
	}
	c := newRankCollector(n.Split())
	fetches := 0
	c.fetch = func(ctx context.Context) map[string][]split.RankWindow {
		fetches++
		return c.split.clusterStall(ctx)
	}
	scrape := func() []string {
		ch := make(chan prometheus.Metric, 64)
		c.Collect(ch)
		close(ch)
		var got []string
		for m := range ch {
			if strings.Contains(m.Desc().String(), "stallfree_rank_wait_share") {
				got = append(got, m.Desc().String())
			}
		}
		return got
	}
	if got := scrape(); len(got) != 3 {
		t.Fatalf("%d wait-share series for three reporting jobs", len(got))
	}
	scrape()
	if fetches != 1 {
		t.Fatalf("two scrapes at once fetched %d times; want once for both and for all jobs", fetches)
	}
	c.mu.Lock()
	c.fetched = time.Now().Add(-2 * stallReuse)
	c.mu.Unlock()
	scrape()
	if fetches != 2 {
		t.Fatalf("a scrape after stallReuse fetched %d times in all; want 2", fetches)
	}
}
