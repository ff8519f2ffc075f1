package control

import (
	"context"
	"fmt"
	"net/url"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/catalog"
)

// Leader is the one way a catalog write reaches the raft leader (Consul's
// forward): every write Control takes goes through Leader(), which answers
// with the local leader when this node leads and with the relay when another
// does. Raft does not forward writes, so the relay sends the request to the
// leader's HTTP API and waits until this node has applied what the leader
// did, so its caller reads its own write.
//
// Callers check what they can before they call (validation, --allow-source):
// a bad request is refused on the node that got it.
type Leader interface {
	// PutDataset lists the source and records the dataset; created is
	// false when it was already registered with that source.
	PutDataset(ctx context.Context, name, spec string) (info api.Dataset, created bool, err error)
	DeleteDataset(ctx context.Context, name string) error
	// RefreshDataset lists a registered dataset's source again as a new
	// version; changed is false when the listing is the registered one.
	// spec, when given, must be the registered source.
	RefreshDataset(ctx context.Context, name, spec string) (info api.Dataset, changed bool, err error)
	// PutJob checks that the job's dataset exists and records the job.
	PutJob(ctx context.Context, j api.Job) (api.Job, error)
	DeleteJob(ctx context.Context, name string) error
	// PinEpoch pins an epoch's member set (see Control.Plan).
	PinEpoch(ctx context.Context, job string, epoch uint64) error
	// SetQuota sets a dataset's quota (quota.Lift lifts it), registering the
	// dataset from source first when source is given.
	SetQuota(ctx context.Context, name, source string, quota api.Quota) (info api.Dataset, created bool, err error)
	// PutGroup defines a coordinated-prep group (package groups); created
	// is false when it was defined so already. DeleteGroup ends one.
	PutGroup(ctx context.Context, g catalog.Group) (_ *catalog.Group, created bool, _ error)
	DeleteGroup(ctx context.Context, name string) error
	// DeriveDataset records a dataset derived from parent (the prep cache,
	// package derived); created is false when it existed with that parent
	// and stage.
	DeriveDataset(ctx context.Context, name, parent, stage string) (info api.Dataset, created bool, err error)
}

// Leader is the way to the leader for one call, chosen by who leads now.
func (c *Control) Leader() Leader {
	if c.cat.IsLeader() {
		return c.local
	}
	return c.relay
}

// localLeader applies writes through this node's raft, which leads.
type localLeader struct{ c *Control }

func (l localLeader) PutDataset(ctx context.Context, name, spec string) (api.Dataset, bool, error) {
	d, created, err := l.c.registerDataset(ctx, name, spec)
	if err != nil {
		return api.Dataset{}, false, err
	}
	return DatasetInfo(d), created, nil
}

func (l localLeader) RefreshDataset(ctx context.Context, name, spec string) (api.Dataset, bool, error) {
	d, changed, err := l.c.refreshDataset(ctx, name, spec)
	if err != nil {
		return api.Dataset{}, false, err
	}
	return DatasetInfo(d), changed, nil
}

func (l localLeader) DeleteDataset(_ context.Context, name string) error {
	return l.c.cat.DeleteDataset(name)
}

func (l localLeader) PutJob(ctx context.Context, j api.Job) (api.Job, error) {
	if _, err := l.c.Dataset(ctx, j.Dataset); err != nil {
		return api.Job{}, err
	}
	got, err := l.c.cat.PutJob(catalog.Job{Name: j.Name, Dataset: j.Dataset, Seed: j.Seed, WorldSize: j.WorldSize,
		BatchSize: j.BatchSize, Ranks: j.Ranks})
	if err != nil {
		return api.Job{}, err
	}
	return jobInfo(got), nil
}

func (l localLeader) DeleteJob(_ context.Context, name string) error { return l.c.cat.DeleteJob(name) }

func (l localLeader) PinEpoch(_ context.Context, job string, epoch uint64) error {
	_, err := l.c.pinnedPlan(job, epoch, true)
	return err
}

func (l localLeader) SetQuota(ctx context.Context, name, source string, quota api.Quota) (api.Dataset, bool, error) {
	created := false
	if source != "" {
		var err error
		if _, created, err = l.c.registerDataset(ctx, name, source); err != nil {
			return api.Dataset{}, false, err
		}
	} else if d, ok := l.c.cat.Dataset(name); !ok {
		return api.Dataset{}, false, fmt.Errorf("%w: no dataset %q (give its source to register it with the quota)", catalog.ErrNotFound, name)
	} else if d.Derived() && !quota.Lift { // lifting one set before quotas were refused here is fine
		return api.Dataset{}, false, derivedQuota(d)
	}
	var q *uint64 // nil lifts it
	if !quota.Lift {
		b := uint64(quota.Bytes)
		q = &b
	}
	d, err := l.c.cat.SetQuota(name, q)
	if err != nil {
		return api.Dataset{}, false, err
	}
	return DatasetInfo(d), created, nil
}

func (l localLeader) PutGroup(_ context.Context, g catalog.Group) (*catalog.Group, bool, error) {
	old, had := l.c.cat.Group(g.Name)
	got, err := l.c.cat.PutGroup(g)
	if err != nil {
		return nil, false, err
	}
	return got, !had || old.Version != got.Version, nil
}

func (l localLeader) DeleteGroup(_ context.Context, name string) error {
	return l.c.cat.DeleteGroup(name)
}

func (l localLeader) DeriveDataset(_ context.Context, name, parent, stage string) (api.Dataset, bool, error) {
	d, created, err := l.c.cat.DeriveDataset(name, parent, stage)
	if err != nil {
		return api.Dataset{}, false, err
	}
	return DatasetInfo(d), created, nil
}

// relayLeader sends writes to the leader's HTTP API.
type relayLeader struct{ c *Control }

func (r relayLeader) PutDataset(ctx context.Context, name, spec string) (info api.Dataset, created bool, err error) {
	// Registering a large dataset lists its source on the leader: allow minutes.
	code, err := r.c.forward(ctx, fasthttp.MethodPut, "/v1/datasets/"+url.PathEscape(name),
		api.PutDataset{Source: spec}, &info, 10*time.Minute)
	return info, code == fasthttp.StatusCreated, err
}

func (r relayLeader) RefreshDataset(ctx context.Context, name, spec string) (info api.Dataset, changed bool, err error) {
	// A refresh lists the source again on the leader: allow minutes.
	code, err := r.c.forward(ctx, fasthttp.MethodPut, "/v1/datasets/"+url.PathEscape(name),
		api.PutDataset{Refresh: true, Source: spec}, &info, 10*time.Minute)
	return info, code == fasthttp.StatusCreated, err
}

func (r relayLeader) DeleteDataset(ctx context.Context, name string) error {
	_, err := r.c.forward(ctx, fasthttp.MethodDelete, "/v1/datasets/"+url.PathEscape(name), nil, nil, 30*time.Second)
	return err
}

func (r relayLeader) PutJob(ctx context.Context, j api.Job) (api.Job, error) {
	var got api.Job
	_, err := r.c.forward(ctx, fasthttp.MethodPut, "/v1/jobs/"+url.PathEscape(j.Name), j, &got, 30*time.Second)
	return got, err
}

func (r relayLeader) DeleteJob(ctx context.Context, name string) error {
	_, err := r.c.forward(ctx, fasthttp.MethodDelete, "/v1/jobs/"+url.PathEscape(name), nil, nil, 30*time.Second)
	return err
}

func (r relayLeader) PinEpoch(ctx context.Context, job string, epoch uint64) error {
	path := fmt.Sprintf("/v1/jobs/%s/epochs/%d/pin", url.PathEscape(job), epoch)
	_, err := r.c.forward(ctx, fasthttp.MethodPost, path, nil, nil, 30*time.Second)
	return err
}

func (r relayLeader) SetQuota(ctx context.Context, name, source string, quota api.Quota) (info api.Dataset, created bool, err error) {
	code, err := r.c.forward(ctx, fasthttp.MethodPut, "/v1/datasets/"+url.PathEscape(name),
		api.PutDataset{Source: source, Quota: quota}, &info, 10*time.Minute)
	return info, code == fasthttp.StatusCreated, err
}

func (r relayLeader) PutGroup(ctx context.Context, g catalog.Group) (*catalog.Group, bool, error) {
	w := g.Window
	body := api.GroupSpec{Dataset: g.Dataset, Seed: g.Seed, BatchSize: g.BatchSize, Jobs: g.Jobs, Window: &w}
	code, err := r.c.forward(ctx, fasthttp.MethodPut, "/v1/groups/"+url.PathEscape(g.Name), body, nil, 30*time.Second)
	if err != nil {
		return nil, false, err
	}
	got, ok := r.c.cat.Group(g.Name)
	if !ok || !got.SameSpec(&g) {
		return nil, false, &api.Error{Status: fasthttp.StatusServiceUnavailable,
			Message: fmt.Sprintf("group %q: the leader's write has not reached this node yet; retry", g.Name)}
	}
	return got, code == fasthttp.StatusCreated, nil
}

func (r relayLeader) DeleteGroup(ctx context.Context, name string) error {
	_, err := r.c.forward(ctx, fasthttp.MethodDelete, "/v1/groups/"+url.PathEscape(name), nil, nil, 30*time.Second)
	return err
}

type relayedKey struct{}

// Relayed marks ctx as serving a request another node relayed here: it is
// never relayed again, so a request cannot bounce between nodes while
// leadership moves.
func Relayed(ctx context.Context) context.Context { return context.WithValue(ctx, relayedKey{}, true) }

func isRelayed(ctx context.Context) bool { v, _ := ctx.Value(relayedKey{}).(bool); return v }

// LeaderHTTP is the raft leader's HTTP address, or "" when unknown.
func (c *Control) LeaderHTTP() string {
	leader := c.cat.Leader()
	switch leader {
	case "":
		return ""
	case c.cfg.Name:
		return c.cfg.HTTPAdvert
	}
	addr, _ := c.members.HTTPAddr(leader)
	return addr
}

// AwaitLeader returns the leader's HTTP address, waiting up to followerGrace
// for one; "" when there is none.
func (c *Control) AwaitLeader(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(ctx, followerGrace)
	defer cancel()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for {
		if addr := c.LeaderHTTP(); addr != "" {
			return addr
		}
		select {
		case <-ctx.Done():
			return ""
		case <-t.C:
		}
	}
}

// forward sends this node's write to the leader and decodes its JSON answer
// into out (when not nil), then waits until this node has applied it. A
// non-2xx answer comes back as *api.Error with the leader's status.
func (c *Control) forward(ctx context.Context, method, path string, body, out any, timeout time.Duration) (int, error) {
	if isRelayed(ctx) {
		// A leader that is not the leader by the time the request arrives: do
		// not bounce it around, let the client retry.
		return 0, &api.Error{Status: fasthttp.StatusServiceUnavailable, Message: "raft leadership is moving; retry", Retry: true}
	}
	addr := c.LeaderHTTP()
	if addr == "" {
		return 0, &api.Error{Status: fasthttp.StatusServiceUnavailable,
			Message: "no raft leader (no quorum): catalog writes are unavailable", Retry: true}
	}
	code, applied, err := writeTo(c.client, addr, method, path, body, out, timeout)
	if err == nil && applied > 0 && !c.awaitApplied(ctx, applied) {
		// The write is done; only this node's next read may not show it yet.
		c.log.Warn("a relayed write has not reached this node's catalog yet", "path", path, "index", applied, "applied", c.cat.AppliedIndex())
	}
	return code, err
}

// awaitApplied waits (briefly) until this node has applied index idx, and
// reports whether it has.
func (c *Control) awaitApplied(ctx context.Context, idx uint64) bool {
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return c.cat.WaitFor(wctx, func() bool { return c.cat.AppliedIndex() >= idx })
}

// leaderHasDataset reports whether the raft leader (another node) knows the
// dataset.
func (c *Control) leaderHasDataset(ctx context.Context, name string) bool {
	addr := c.AwaitLeader(ctx)
	if addr == "" || c.cat.IsLeader() {
		return false
	}
	return answersOK(c.client, addr, "/v1/datasets/"+url.PathEscape(name))
}

// ReadFromLeader answers a read that names a dataset or job this follower
// does not know with the leader's answer: in is the request as this node got
// it, out receives the leader's response. A follower restarted moments ago
// learns the commit index, and so applies even the log it holds on disk,
// only when the leader next replicates to it, which raft's backoff can delay
// by seconds; a 404 meanwhile would be wrong. It reports whether out holds
// the leader's answer; false (this node leads, no leader, no answer) means
// the caller answers from the local catalog.
func (c *Control) ReadFromLeader(in *fasthttp.Request, out *fasthttp.Response) bool {
	if c.cat.IsLeader() {
		return false
	}
	addr := c.AwaitLeader(context.Background())
	if addr == "" {
		return false
	}
	if err := proxyTo(c.client, addr, in, out); err != nil {
		c.log.Debug("relay to leader", "err", err)
		return false
	}
	if c.cfg.RelayedRead != nil {
		c.cfg.RelayedRead()
	}
	return true
}

func (r relayLeader) DeriveDataset(ctx context.Context, name, parent, stage string) (info api.Dataset, created bool, err error) {
	code, err := r.c.forward(ctx, fasthttp.MethodPut, "/v1/datasets/"+url.PathEscape(name),
		api.PutDataset{DerivedFrom: parent, Stage: stage}, &info, 30*time.Second)
	return info, code == fasthttp.StatusCreated, err
}
