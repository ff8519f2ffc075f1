package node

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/url"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/derived"
)

// The catalog operations every caller (HTTP API, cachectl through it, the
// benchmarks, tests) goes through: checks first, writes on the leader, reads
// that give a follower a moment to catch up.

// DatasetInfo is a dataset's catalog entry as the API shows it.
func DatasetInfo(d *catalog.Dataset) api.Dataset {
	if d.Derived() {
		return derived.Info(d)
	}
	return api.Dataset{Name: d.Name, Source: d.Source, Items: d.Manifest.Len(), Bytes: d.Manifest.TotalBytes(),
		Version: d.Version, ID: d.ID, Samples: d.Manifest.Samples(), Shards: len(d.Manifest.Shards), LeftOut: d.Manifest.LeftOut,
		Quota: d.Quota}
}

func jobInfo(j *catalog.Job) api.Job {
	out := api.Job{Name: j.Name, Dataset: j.Dataset, Seed: j.Seed, WorldSize: j.WorldSize, BatchSize: j.BatchSize,
		Ranks: j.Ranks, Version: j.Version}
	if p := j.Prev; p != nil {
		out.Previous = &api.JobGeneration{Generation: p.Version, WorldSize: p.WorldSize, Ranks: p.Ranks}
	}
	return out
}

// Datasets lists the datasets this node's catalog holds.
func (n *Node) Datasets() []api.Dataset {
	out := []api.Dataset{}
	for _, d := range n.cat.Datasets() {
		out = append(out, DatasetInfo(d))
	}
	return out
}

// HasDataset reports whether this node's catalog holds the dataset now.
func (n *Node) HasDataset(name string) bool { _, ok := n.cat.Dataset(name); return ok }

// HasJob reports whether this node's catalog holds the job now.
func (n *Node) HasJob(name string) bool { _, ok := n.cat.Job(name); return ok }

// Dataset finds a dataset, giving a follower a moment to catch up, and
// longer when the leader confirms the dataset exists.
func (n *Node) Dataset(ctx context.Context, name string) (*catalog.Dataset, error) {
	d, ok := n.cat.Dataset(name)
	if ok || n.cat.IsLeader() {
		if !ok {
			return nil, fmt.Errorf("%w: no dataset %q", catalog.ErrNotFound, name)
		}
		return d, nil
	}
	wait := followerGrace
	if n.leaderHas(ctx, "/v1/datasets/"+url.PathEscape(name)) {
		wait = catchUpWait
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	n.cat.WaitFor(wctx, func() bool { d, ok = n.cat.Dataset(name); return ok })
	cancel()
	if !ok {
		return nil, fmt.Errorf("%w: no dataset %q", catalog.ErrNotFound, name)
	}
	return d, nil
}

// PutDataset registers a dataset (idempotent for the same source). It
// checks --allow-source here, before anything is forwarded or listed, and
// registers on the leader. created is false when it already existed.
func (n *Node) PutDataset(ctx context.Context, name, spec string) (info api.Dataset, created bool, err error) {
	if _, err := n.CheckSource(spec); err != nil {
		return api.Dataset{}, false, err
	}
	if !n.cat.IsLeader() {
		// Registering a large dataset lists its source on the leader: allow minutes.
		code, err := n.forward(ctx, fasthttp.MethodPut, "/v1/datasets/"+url.PathEscape(name),
			api.PutDataset{Source: spec}, &info, 10*time.Minute)
		return info, code == fasthttp.StatusCreated, err
	}
	d, created, err := n.RegisterDataset(ctx, name, spec)
	if err != nil {
		return api.Dataset{}, false, err
	}
	return DatasetInfo(d), created, nil
}

// DeleteDataset removes a dataset from the catalog (on the leader).
func (n *Node) DeleteDataset(ctx context.Context, name string) error {
	if !n.cat.IsLeader() {
		_, err := n.forward(ctx, fasthttp.MethodDelete, "/v1/datasets/"+url.PathEscape(name), nil, nil, 30*time.Second)
		return err
	}
	return n.cat.DeleteDataset(name)
}

// Jobs lists the registered jobs.
func (n *Node) Jobs() []api.Job {
	out := []api.Job{}
	for _, j := range n.cat.Jobs() {
		out = append(out, jobInfo(j))
	}
	return out
}

// lookupJob finds a job, giving a follower a moment to catch up.
func (n *Node) lookupJob(ctx context.Context, name string) (*catalog.Job, bool) {
	j, ok := n.cat.Job(name)
	if !ok && !n.cat.IsLeader() {
		wctx, cancel := context.WithTimeout(ctx, followerGrace)
		n.cat.WaitFor(wctx, func() bool { j, ok = n.cat.Job(name); return ok })
		cancel()
	}
	return j, ok
}

// Job describes a registered job.
func (n *Node) Job(ctx context.Context, name string) (api.Job, error) {
	j, ok := n.lookupJob(ctx, name)
	if !ok {
		return api.Job{}, fmt.Errorf("%w: no job %q", catalog.ErrNotFound, name)
	}
	return jobInfo(j), nil
}

// PutJob registers or replaces a job after checking its layout; the leader
// checks that its dataset exists (this node may not have caught up).
func (n *Node) PutJob(ctx context.Context, j api.Job) (api.Job, error) {
	if err := j.Validate(); err != nil {
		return api.Job{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if !n.cat.IsLeader() {
		var got api.Job
		_, err := n.forward(ctx, fasthttp.MethodPut, "/v1/jobs/"+url.PathEscape(j.Name), j, &got, 30*time.Second)
		return got, err
	}
	if _, err := n.Dataset(ctx, j.Dataset); err != nil {
		return api.Job{}, err
	}
	got, err := n.cat.PutJob(catalog.Job{Name: j.Name, Dataset: j.Dataset, Seed: j.Seed, WorldSize: j.WorldSize,
		BatchSize: j.BatchSize, Ranks: j.Ranks})
	if err != nil {
		return api.Job{}, err
	}
	return jobInfo(got), nil
}

// DeleteJob removes a job (on the leader).
func (n *Node) DeleteJob(ctx context.Context, name string) error {
	if !n.cat.IsLeader() {
		_, err := n.forward(ctx, fasthttp.MethodDelete, "/v1/jobs/"+url.PathEscape(name), nil, nil, 30*time.Second)
		return err
	}
	return n.cat.DeleteJob(name)
}

// Cluster is GET /v1/cluster: every member this node knows, with each alive
// member's cache figures.
func (n *Node) Cluster() api.Cluster {
	st := n.Stats()
	self := api.Member{Name: n.cfg.Name, HTTP: n.cfg.HTTPAdvert, Peer: n.cfg.PeerAdvert, State: "alive",
		Items: st.ItemsCached, Bytes: st.BytesCached, Capacity: st.CapacityBytes, Share: 1, Socket: n.cfg.Socket}
	info := api.Cluster{Self: n.cfg.Name, Leader: n.cat.Leader(), Members: n.peers.Describe(self)}
	if servers, err := n.cat.Servers(); err == nil {
		role := map[string]string{}
		for _, sv := range servers {
			role[sv.ID] = map[bool]string{true: "voter", false: "nonvoter"}[sv.Voter]
		}
		for i := range info.Members {
			info.Members[i].Raft = role[info.Members[i].Name]
		}
	}
	return info
}

// ownerMap is a dataset's owner table for one ring, kept until either changes.
type ownerMap struct {
	ring, version uint64
	owners        api.Owners
}

// RingVersion names the ring owners are computed on now; clients that route
// by owner compare it (the X-Ring header, in hex) with their table's.
func (n *Node) RingVersion() uint64 { return n.peers.Ring().Version() }

func ringID(v uint64) string { return strconv.FormatUint(v, 16) }

// Owners is d's owner table: which member owns each index, so that clients
// can read from the owner directly.
func (n *Node) Owners(d *catalog.Dataset) api.Owners {
	ring := n.peers.Ring()
	n.mu.Lock()
	if m, ok := n.owners[d.ID]; ok && m.ring == ring.Version() && m.version == d.Version {
		n.mu.Unlock()
		return m.owners
	}
	n.mu.Unlock()
	members := ring.Members()
	if ring.Empty() {
		members = []string{n.cfg.Name}
	}
	out := api.Owners{Ring: ringID(ring.Version()), Members: make([]api.OwnerMember, len(members))}
	pos := make(map[string]int, len(members))
	for x, m := range members {
		pos[m] = x
		addr := n.cfg.HTTPAdvert
		if m != n.cfg.Name {
			addr, _ = n.peers.HTTPAddr(m)
		}
		out.Members[x] = api.OwnerMember{Name: m, HTTP: addr}
	}
	width := 1
	if len(members) > 255 {
		width = 2
	}
	out.Owners = make([]byte, width*d.Manifest.Len())
	if !ring.Empty() {
		for i := range d.Manifest.Len() {
			x := pos[ring.Owner(d.RingName(), d.Manifest.OwnerKey(i))]
			if width == 1 {
				out.Owners[i] = byte(x)
			} else {
				binary.LittleEndian.PutUint16(out.Owners[2*i:], uint16(x))
			}
		}
	}
	n.mu.Lock()
	n.owners[d.ID] = ownerMap{ring: ring.Version(), version: d.Version, owners: out}
	n.mu.Unlock()
	return out
}
