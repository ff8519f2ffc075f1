package node

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
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

// A member from before /v1/internal/stall answers it 404: it is asked job
// by job instead, for the jobs that report here, and its ranks count.
func TestStallFromAMemberOfBefore(t *testing.T) {
	n, _, _, p := withTwoMembers(t, 40, 8)
	var perJob, asked atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		if r.URL.Path != "/v1/internal/jobs/a/stall" {
			http.NotFound(w, r)
			return
		}
		perJob.Add(1)
		json.NewEncoder(w).Encode([]split.RankWindow{{Rank: 1, Node: "t2", WaitS: 3, StepS: 1, Batches: 1, Items: 4,
			LastUnixMs: time.Now().UnixMilli()}})
	}))
	defer srv.Close()
	p.http = strings.TrimPrefix(srv.URL, "http://")
	n.split.book.Add(split.Report{Job: "a", Rank: 0, WaitS: 1, StepS: 3, Batches: 1, Items: 4}, 0)
	got := n.Split().clusterStall(context.Background())
	if len(got["a"]) != 2 || perJob.Load() != 1 {
		t.Fatalf("job a's windows %+v (%d per-job requests); want rank 0 here and rank 1 from t2, in one request", got["a"], perJob.Load())
	}
	// Nothing reports here: nothing is asked.
	asked.Store(0)
	n2, _, _, p2 := withTwoMembers(t, 40, 8)
	p2.http = p.http
	if got := n2.Split().clusterStall(context.Background()); len(got) != 0 || asked.Load() != 0 {
		t.Fatalf("with no rank reporting here: %v, %d requests", got, asked.Load())
	}
}
