package httpapi

import (
	"context"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/control"
	"stallfree/node"
)

// The narrow interfaces the handlers hold (etcd's rhythm: each handler sees
// what it uses, not the node). *control.Control serves the catalog's, and
// *node.Node the item path's.

// Relay is how a follower answers what it cannot answer yet: a read it
// hands to the leader, and the index a write it applied was given, for the
// follower that relayed it (read-your-writes).
type Relay interface {
	ReadFromLeader(in *fasthttp.Request, out *fasthttp.Response) bool
	AppliedIndex() uint64
}

// Finder finds the dataset a request names, giving a follower a moment to
// catch up (control.Control.Dataset).
type Finder interface {
	Relay
	Gate
	HasDataset(name string) bool
	Dataset(ctx context.Context, name string) (*catalog.Dataset, error)
}

// Datasets is what the dataset routes use.
type Datasets interface {
	Finder
	Datasets() []api.Dataset
	PutDataset(ctx context.Context, name, spec string) (api.Dataset, bool, error)
	RefreshDataset(ctx context.Context, name, spec string) (api.Dataset, bool, error)
	DeleteDataset(ctx context.Context, name string) error
	Registration(name string) (api.Registration, bool)
}

// Jobs is what the job routes use.
type Jobs interface {
	Relay
	Gate
	Jobs() []api.Job
	HasJob(name string) bool
	Job(ctx context.Context, name string) (api.Job, error)
	PutJob(ctx context.Context, j api.Job) (api.Job, error)
	DeleteJob(ctx context.Context, name string) error
	ReportPosition(job string, p api.RankPosition) error
	RankPositions(job string) []api.RankPosition
	PinEpoch(ctx context.Context, job string, epoch uint64) error
	RankOrder(ctx context.Context, job string, epoch uint64, rank int) (api.RankOrder, error)
	ResumedOrder(ctx context.Context, job string, epoch uint64, rank int, from uint64, position int) (api.RankOrder, error)
}

// Served is what every route that sends items reports to.
type Served interface {
	// ServedBytes counts item bytes sent to a client.
	ServedBytes(b int)
	// RingVersion is the X-Ring header's value.
	RingVersion() uint64
}

// Items is the item path, as the item, batch and sample routes use it.
type Items interface {
	Served
	Get(ctx context.Context, d *catalog.Dataset, index int) (node.Item, error)
	GetManyFor(ctx context.Context, d *catalog.Dataset, indices []int, job string) ([]node.Item, error)
	GetManyPartial(ctx context.Context, d *catalog.Dataset, indices []int, job string) ([]node.Item, error)
	LocateMany(d *catalog.Dataset, indices []int, job string) (node.Located, bool, error)
	GetSamplesFor(ctx context.Context, d *catalog.Dataset, samples []int, job string) ([]node.Item, []node.SampleSpan, error)
	ReadUncached(ctx context.Context, d *catalog.Dataset, index int) (node.Item, error)
	Owners(d *catalog.Dataset) api.Owners
}

// Batches is what a job's minibatch route uses.
type Batches interface {
	Served
	JobBatch(ctx context.Context, job string, epoch uint64, rank, b int) ([]node.Item, []node.SampleSpan, error)
}

// Warmups is what the warm-up routes use.
type Warmups interface {
	StartWarmup(d *catalog.Dataset) api.Progress
	WarmupProgress(d *catalog.Dataset) api.Progress
}

// Status is what the probes and the figures use.
type Status interface {
	Ready() (bool, string)
	Stats() api.Stats
	Cluster() api.Cluster
}

// Loader takes what stall meters report (POST /v1/loader/wait).
type Loader interface {
	ReportLoader(r api.LoaderWait)
}

var (
	_ Datasets = (*control.Control)(nil)
	_ Jobs     = (*control.Control)(nil)
	_ Items    = (*node.Node)(nil)
	_ Batches  = (*node.Node)(nil)
	_ Warmups  = (*node.Node)(nil)
	_ Status   = (*node.Node)(nil)
	_ Splitter = node.MemorySplit{}
	_ Loader   = node.MemorySplit{}
)

const (
	get  = fasthttp.MethodGet
	put  = fasthttp.MethodPut
	post = fasthttp.MethodPost
	del  = fasthttp.MethodDelete
)

// routes is the API (docs/api.md), one route a line. Routes are tried in
// order; the first whose pattern and method fit serves. A new route is one
// line here and its handler in a file of its own, holding the narrow
// interface it uses.
func (s *Server) routes(n *node.Node) []route {
	c := n.Control()
	sp := splitRoutes{sp: n.Split(), relay: c}
	dv := derivedRoutes{prep: s.prep, find: c, peers: c.Relay()}
	ds := datasetRoutes{c: c, quota: sp, derived: dv}
	it := itemRoutes{find: c, items: n, readers: &s.readers}
	wu := warmupRoutes{find: c, w: n}
	jb := jobRoutes{c: c, stall: n.Split()}
	ord := orderRoutes{c: c, b: n}
	st := statusRoutes{n: n, loader: n.Split(), relay: c, metrics: s.metrics, checkpoints: s.checkpointStats}
	ck := checkpointRoutes{s: s}
	return []route{
		{method: get, pattern: "/healthz", handle: healthz, open: true},
		{method: get, pattern: "/readyz", handle: st.ready, open: true},
		{method: get, pattern: "/metrics", handle: st.prometheus, open: true},

		{method: get, pattern: "/v1/stats", handle: st.stats},
		{method: get, pattern: "/v1/cluster", handle: st.cluster},
		{method: post, pattern: "/v1/loader/wait", handle: st.loaderWait},

		{method: get, pattern: "/v1/datasets", handle: ds.list},
		{method: put, pattern: "/v1/datasets/{dataset}", handle: ds.put},
		{method: get, pattern: "/v1/datasets/{dataset}", handle: ds.get},
		{method: del, pattern: "/v1/datasets/{dataset}", handle: ds.delete},
		{method: get, pattern: "/v1/datasets/{dataset}/registration", handle: ds.registration},
		{method: get, pattern: "/v1/datasets/{dataset}/items/{key...}", handle: it.byKey},
		{method: get, pattern: "/v1/datasets/{dataset}/index/{index}", handle: it.byIndex},
		{method: put, pattern: "/v1/datasets/{dataset}/index/{index}", handle: dv.putItem, limit: s.itemBodyLimit, recycle: true},
		{method: post, pattern: "/v1/datasets/{dataset}/batch", handle: it.batch},
		{method: put, pattern: "/v1/datasets/{dataset}/batch", handle: dv.putBatch, limit: s.writeBatchBodyLimit, recycle: true},
		{method: post, pattern: "/v1/datasets/{dataset}/samples/batch", handle: it.samples},
		{method: get, pattern: "/v1/datasets/{dataset}/samples/{sample}", handle: it.sample},
		{method: get, pattern: "/v1/datasets/{dataset}/owners", handle: it.owners},
		{method: post, pattern: "/v1/datasets/{dataset}/warmup", handle: wu.start},
		{method: get, pattern: "/v1/datasets/{dataset}/warmup", handle: wu.progress},

		{method: get, pattern: "/v1/jobs", handle: jb.list},
		{method: get, pattern: "/v1/jobs/{job}", handle: jb.get},
		{method: put, pattern: "/v1/jobs/{job}", handle: jb.put},
		{method: del, pattern: "/v1/jobs/{job}", handle: jb.delete},
		{method: get, pattern: "/v1/jobs/{job}/positions", handle: jb.positions},
		{method: post, pattern: "/v1/jobs/{job}/ranks/{rank}/position", handle: jb.reportPosition},
		{method: post, pattern: "/v1/jobs/{job}/epochs/{epoch}/pin", handle: ord.pin},
		{method: get, pattern: "/v1/jobs/{job}/epochs/{epoch}/ranks/{rank}", handle: ord.order},
		{method: get, pattern: "/v1/jobs/{job}/epochs/{epoch}/ranks/{rank}/batches/{batch}", handle: ord.batch},

		{method: get, pattern: "/v1/plan", handle: sp.plan},
		{method: post, pattern: "/v1/plan/apply", handle: sp.apply},

		{method: get, pattern: "/v1/groups", handle: s.groupList},
		{method: get, pattern: "/v1/groups/{group}", handle: s.groupGet},
		{method: put, pattern: "/v1/groups/{group}", handle: s.groupPut},
		{method: del, pattern: "/v1/groups/{group}", handle: s.groupDelete},
		{method: post, pattern: "/v1/groups/{group}/jobs/{job}/alive", handle: s.groupAlive},
		{method: get, pattern: "/v1/groups/{group}/epochs/{epoch}/batches/{batch}", handle: s.groupBatchRoute},
		{method: put, pattern: "/v1/groups/{group}/epochs/{epoch}/batches/{batch}", handle: s.groupBatchRoute, limit: s.groupBodyLimit},

		{method: get, pattern: "/v1/checkpoints", handle: ck.served(ck.list)},
		{method: get, pattern: "/v1/checkpoints/{checkpoint}", handle: ck.served(ck.get)},
		{method: del, pattern: "/v1/checkpoints/{checkpoint}", handle: ck.served(ck.delete)},
		{method: post, pattern: "/v1/checkpoints/{checkpoint}/steps/{step}/commit", handle: ck.served(ck.commit), stream: true},
		{method: get, pattern: "/v1/checkpoints/{checkpoint}/steps/{step}/parts", handle: ck.served(ck.uploads)},
		{method: put, pattern: "/v1/checkpoints/{checkpoint}/steps/{step}/parts/{part}", handle: ck.served(ck.putPart), stream: true},
		{method: get, pattern: "/v1/checkpoints/{checkpoint}/steps/{step}/parts/{part}", handle: ck.served(ck.getPart)},
		// Between nodes: a node's own copies.
		{method: del, pattern: "/v1/internal/checkpoints/{checkpoint}", handle: ck.served(ck.dropLocal)},
		{method: get, pattern: "/v1/internal/checkpoints/{checkpoint}/steps/{step}", handle: ck.served(ck.held)},
		{method: put, pattern: "/v1/internal/checkpoints/{checkpoint}/steps/{step}/parts/{part}", handle: ck.served(ck.putReplica), stream: true},
		{method: get, pattern: "/v1/internal/checkpoints/{checkpoint}/steps/{step}/parts/{part}", handle: ck.served(ck.getLocal)},
		{method: get, pattern: "/v1/internal/jobs/{job}/stall", handle: jb.localStall},
		{method: get, pattern: "/v1/internal/stall", handle: jb.localActiveStall},
		{method: post, pattern: "/v1/internal/checkpoints/{checkpoint}/steps/{step}/parts/{part}/copy", handle: ck.served(ck.copy)},
	}
}
