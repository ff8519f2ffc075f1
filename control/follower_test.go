package control_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/control"
	"stallfree/groups"
	"stallfree/httpapi"
	"stallfree/internal/testcluster"
	"stallfree/internal/testutil"
	"stallfree/node"
)

// A follower's writes go one way, to the leader over its HTTP API (two real
// nodes: raft on disk, gossip, HTTP on loopback), and each is in the
// follower's own catalog when the call returns: read-your-writes. The
// leader's refusals come back with its status.
func TestFollowerWritesGoThroughTheLeader(t *testing.T) {
	testutil.Long(t)
	tc := testcluster.New(t)
	tc.Serve = func(n *node.Node, srv *httpapi.Server) { // the group routes, as cachenode serves them
		grp := groups.New(n.GroupHost(), groups.Config{Relay: n.Control().Relay(), Logger: testutil.Discard()})
		t.Cleanup(grp.Close)
		srv.EnableGroups(grp)
	}
	lead, follower := tc.Add("n1"), tc.Add("n2")
	l, f := lead.Control(), follower.Control()
	if !l.IsLeader() || f.IsLeader() {
		t.Fatal("n1 bootstrapped the cluster and should lead")
	}
	if f.LeaderHTTP() != lead.HTTP || f.AwaitLeader(context.Background()) != lead.HTTP || l.LeaderHTTP() != lead.HTTP {
		t.Fatalf("leader's address %q from the follower, %q from itself; want %s", f.LeaderHTTP(), l.LeaderHTTP(), lead.HTTP)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir, _ := testutil.RandomFiles(t, 12, 10)

	info, created, err := f.PutDataset(ctx, "ds", dir)
	if err != nil || !created || info.Items != 12 || info.Bytes != 120 {
		t.Fatalf("register through the follower: %+v, %v, %v", info, created, err)
	}
	if !f.HasDataset("ds") || f.AppliedIndex() < info.Version {
		t.Fatal("the follower's own write is not in its catalog when the call returns")
	}
	if _, created, err := f.PutDataset(ctx, "ds", dir); err != nil || created {
		t.Fatalf("again: created %v, %v", created, err)
	}
	other, _ := testutil.RandomFiles(t, 1, 1)
	if _, _, err := f.PutDataset(ctx, "ds", other); status(err) != http.StatusConflict {
		t.Fatalf("another source: %v", err)
	}
	if r, ok := l.Registration("ds"); !ok || r.Listed != 12 {
		t.Fatal("the leader did not list the source")
	}
	if _, ok := f.Registration("ds"); ok {
		t.Fatal("the follower listed the source itself")
	}

	j, err := f.PutJob(ctx, api.Job{Name: "j", Dataset: "ds", Seed: 4, WorldSize: 2, BatchSize: 2, Ranks: []string{"n1", "n2"}})
	if err != nil || j.Version == 0 || !f.HasJob("j") {
		t.Fatalf("job through the follower: %+v, %v", j, err)
	}
	if _, err := f.PutJob(ctx, api.Job{Name: "k", Dataset: "none", WorldSize: 1, BatchSize: 1}); status(err) != http.StatusNotFound {
		t.Fatalf("a job over no dataset, checked on the leader: %v", err)
	}
	// The follower's first read of an epoch pins it on the leader; both
	// then answer the same order.
	fo, err := f.RankOrder(ctx, "j", 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	lo, err := l.RankOrder(ctx, "j", 0, 1)
	if err != nil || !slices.Equal(fo.Indices, lo.Indices) || fo.Remote != lo.Remote {
		t.Fatalf("orders differ: follower %v, leader %v (%v)", fo.Indices, lo.Indices, err)
	}
	if _, err := f.RankOrder(ctx, "j", 2, 0); !errors.Is(err, control.ErrBadRequest) {
		t.Fatalf("an epoch that cannot start: %v", err)
	}

	q, created, err := f.SetQuota(ctx, "ds", "", api.QuotaOf(5))
	if err != nil || created || q.Quota == nil || *q.Quota != 5 {
		t.Fatalf("quota: %+v, %v, %v", q, created, err)
	}
	if q, created, err := f.SetQuota(ctx, "ds2", dir, api.QuotaOf(6)); err != nil || !created || q.Items != 12 || !f.HasDataset("ds2") {
		t.Fatalf("register with a quota: %+v, %v, %v", q, created, err)
	}

	g := catalog.Group{Name: "g", Dataset: "ds", Seed: 1, BatchSize: 4, Jobs: 2, Window: 2}
	got, created, err := f.PutGroup(ctx, g)
	if err != nil || !created || got.Samples != 12 {
		t.Fatalf("group: %+v, %v, %v", got, created, err)
	}
	if _, created, err := f.PutGroup(ctx, g); err != nil || created {
		t.Fatalf("group again: created %v, %v", created, err)
	}
	if err := f.DeleteGroup(ctx, "g"); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteGroup(ctx, "g"); status(err) != http.StatusNotFound {
		t.Fatalf("group ended twice: %v", err)
	}

	d, created, err := f.Leader().DeriveDataset(ctx, "ds.dec", "ds", "decode")
	if err != nil || !created || d.DerivedFrom != "ds" || !f.HasDataset("ds.dec") {
		t.Fatalf("derive: %+v, %v, %v", d, created, err)
	}
	if _, created, err := f.Leader().DeriveDataset(ctx, "ds.dec", "ds", "decode"); err != nil || created {
		t.Fatalf("derive again: %v, %v", created, err)
	}

	if err := f.DeleteJob(ctx, "j"); err != nil || f.HasJob("j") {
		t.Fatalf("delete job: %v", err)
	}
	if err := f.DeleteJob(ctx, "j"); status(err) != http.StatusNotFound {
		t.Fatalf("job deleted twice: %v", err)
	}
	if err := f.DeleteDataset(ctx, "ds2"); err != nil || f.HasDataset("ds2") {
		t.Fatalf("delete dataset: %v", err)
	}
	if err := f.DeleteDataset(ctx, "ds2"); status(err) != http.StatusNotFound {
		t.Fatalf("dataset deleted twice: %v", err)
	}
	if _, err := f.Dataset(ctx, "ds2"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("a deleted dataset found: %v", err)
	}
	if d, err := f.Dataset(ctx, "ds"); err != nil || d.Manifest.Len() != 12 {
		t.Fatalf("a dataset found on the follower: %v", err)
	}
}

// A read the follower relays goes to the leader and its answer comes back
// whole; a request relayed once is never relayed again.
func TestFollowerReadsFromTheLeader(t *testing.T) {
	testutil.Long(t)
	tc := testcluster.New(t)
	lead, follower := tc.Add("n1"), tc.Add("n2")
	dir, _ := testutil.RandomFiles(t, 3, 4)
	if _, _, err := lead.Control().PutDataset(context.Background(), "ds", dir); err != nil {
		t.Fatal(err)
	}
	testutil.Await(t, "the dataset to reach the follower", func() bool { return follower.Control().HasDataset("ds") })
	in, out := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(in)
	defer fasthttp.ReleaseResponse(out)
	in.Header.SetMethod(http.MethodGet)
	in.SetRequestURI("http://" + follower.HTTP + "/v1/datasets/ds")
	if !follower.Control().ReadFromLeader(in, out) {
		t.Fatal("the follower answered alone")
	}
	if out.StatusCode() != http.StatusOK || !strings.Contains(string(out.Body()), `"name":"ds"`) {
		t.Fatalf("the leader's answer: %d %s", out.StatusCode(), out.Body())
	}
	if lead.Control().ReadFromLeader(in, out) {
		t.Fatal("the leader relayed a read")
	}
	err := follower.Control().DeleteDataset(control.Relayed(context.Background()), "ds")
	if status(err) != http.StatusServiceUnavailable || !follower.Control().HasDataset("ds") {
		t.Fatalf("a relayed write relayed again: %v", err)
	}
}

func status(err error) int {
	if e, ok := errors.AsType[*api.Error](err); ok {
		return e.Status
	}
	return 0
}
