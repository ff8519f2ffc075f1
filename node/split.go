package node

import (
	"context"
	"encoding/binary"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/planner"
	"stallfree/split"
	"stallfree/store"
)

// The memory split by sensitivity (docs/api.md): dataset quotas, what
// stall meters report, and the plan. The model and the split are the
// planner package's; the reports and storage figures are split's; what is
// here ties them to the catalog and the store.

// MemorySplit is the node's part of the memory split: its quotas, what stall
// meters report to it, and the plan (Node.Split). It is the node seen from
// the split's side, so the node's own method set stays the item path's.
type MemorySplit struct{ n *Node }

// Split is this node's part of the memory split.
func (n *Node) Split() MemorySplit { return MemorySplit{n} }

// Holds reports whether this node's memory holds item index of d now. Tests
// and diagnostics use it to wait for read-ahead instead of racing it.
func (m MemorySplit) Holds(d *catalog.Dataset, index int) bool {
	return m.n.store.Contains(store.MakeKey(d.ID, uint32(index)))
}

// splitState is the node's part of the split.
type splitState struct {
	book  *split.Book
	meter *split.Meter

	mu sync.Mutex // one applyQuotas at a time; guards what follows
	// limited are the datasets this node's store has a limit for.
	limited map[uint32]bool
	shares  map[uint32]shareOf
}

// shareOf is a dataset's share here, for one ring (a dataset ID names one
// manifest for good, as in ownerMap).
type shareOf struct {
	ring  uint64
	share float64
}

func newSplitState() splitState {
	return splitState{book: split.NewBook(), meter: split.NewMeter(), limited: map[uint32]bool{}, shares: map[uint32]shareOf{}}
}

// quotaLoop keeps the store's per-dataset limits at each quota's share
// here: after every catalog change, and every second for ring changes.
func (m MemorySplit) quotaLoop() {
	n := m.n
	defer n.wg.Done()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		updated := n.cat.Updated()
		m.applyQuotas()
		select {
		case <-n.ctx.Done():
			return
		case <-updated:
		case <-tick.C:
		}
	}
}

// applyQuotas sets this node's limit of every dataset with a quota to the
// quota times the share of the dataset's bytes this node owns by the ring,
// so that the cluster as a whole holds at most the quota.
func (m MemorySplit) applyQuotas() {
	n := m.n
	n.split.mu.Lock()
	defer n.split.mu.Unlock()
	live := map[uint32]bool{}
	for _, d := range n.cat.Datasets() {
		live[d.ID] = true
		if d.Quota == nil {
			if n.split.limited[d.ID] {
				n.store.ClearLimit(d.ID)
				delete(n.split.limited, d.ID)
			}
			continue
		}
		share, ok := m.localShare(d)
		if !ok {
			continue // not on the ring yet: keep what was set
		}
		limit := uint64(float64(*d.Quota) * share)
		if cur, ok := n.store.Limit(d.ID); ok && cur == limit {
			continue
		}
		dropped := n.store.SetLimit(d.ID, limit)
		n.split.limited[d.ID] = true
		n.log.Info("dataset quota", "dataset", d.Name, "quota", *d.Quota, "share", share, "limit", limit, "dropped", dropped)
	}
	for id := range n.split.limited {
		if !live[id] {
			n.store.ClearLimit(id)
			delete(n.split.limited, id)
			n.split.meter.Forget(id)
		}
	}
}

// localShare is the fraction of d's bytes this node owns by the ring (1
// when it runs alone); ok is false while this node is not on the ring.
// Called with n.split.mu held.
func (m MemorySplit) localShare(d *catalog.Dataset) (float64, bool) {
	n := m.n
	ring := n.peers.Ring()
	if ring.Empty() {
		return 1, true
	}
	if s, ok := n.split.shares[d.ID]; ok && s.ring == ring.Version() {
		return s.share, true
	}
	o := n.Owners(d)
	self := slices.IndexFunc(o.Members, func(m api.OwnerMember) bool { return m.Name == n.cfg.Name })
	if self < 0 {
		return 0, false
	}
	width := 1
	if len(o.Members) > 255 {
		width = 2
	}
	var own, total float64
	for i := range d.Manifest.Len() {
		size := float64(d.Manifest.Size(i))
		total += size
		x := int(o.Owners[i])
		if width == 2 {
			x = int(binary.LittleEndian.Uint16(o.Owners[2*i:]))
		}
		if x == self {
			own += size
		}
	}
	share := 1.0
	if total > 0 {
		share = own / total
	}
	n.split.shares[d.ID] = shareOf{ring: ring.Version(), share: share}
	return share, true
}

func (m MemorySplit) shareOf(d *catalog.Dataset) float64 {
	n := m.n
	n.split.mu.Lock()
	defer n.split.mu.Unlock()
	s, ok := m.localShare(d)
	if !ok || s <= 0 {
		return 1
	}
	return s
}

// ClusterMemory is the cache memory of the members alive now.
func (m MemorySplit) ClusterMemory() uint64 {
	n := m.n
	var sum uint64
	for _, m := range n.peers.Describe(api.Member{Name: n.cfg.Name, State: "alive", Capacity: n.cfg.Memory}) {
		if m.State == "alive" || m.State == "suspect" {
			sum += m.Capacity
		}
	}
	return sum
}

// PutQuota sets dataset name's quota (or lifts it), registering the dataset
// from source first when source is given (as PUT /v1/datasets/{name} does
// without a quota). A negative quota, or one over the cluster's memory, is
// refused before anything changes.
func (m MemorySplit) PutQuota(ctx context.Context, name, source string, quota api.Quota) (info api.Dataset, created bool, err error) {
	n := m.n
	if !quota.Lift && quota.Bytes < 0 {
		return api.Dataset{}, false, fmt.Errorf("%w: quota %d: want a number of bytes, 0 or more", ErrBadRequest, quota.Bytes)
	}
	if mem := m.ClusterMemory(); !quota.Lift && uint64(quota.Bytes) > mem {
		return api.Dataset{}, false, fmt.Errorf("%w: quota %d bytes is over the cluster's memory (%d bytes)", ErrBadRequest, quota.Bytes, mem)
	}
	// The write takes the one way to the leader (control.Leader).
	if info, created, err = n.ctl.SetQuota(ctx, name, source, quota); err != nil {
		return api.Dataset{}, false, err
	}
	m.applyQuotas() // this node's limit holds when the answer arrives
	return info, created, nil
}

// ReportLoader records a stall meter's report: the node-wide wait counters
// and, for the split, the job's epoch figures.
func (m MemorySplit) ReportLoader(r api.LoaderWait) {
	n := m.n
	n.counters.loaderWaitNs.Add(uint64(r.Seconds * float64(time.Second)))
	n.counters.loaderBatches.Add(r.Batches)
	ds := r.Dataset
	if ds == "" && r.Job != "" {
		if j, ok := n.cat.Job(r.Job); ok {
			ds = j.Dataset
		}
	}
	var src uint64
	if d, ok := n.cat.Dataset(ds); ok {
		src, _ = n.split.meter.Read(d.ID)
	} else {
		ds = ""
	}
	n.split.book.Add(split.Report{Job: r.Job, Dataset: ds, Rank: r.Rank, WaitS: r.Seconds, StepS: r.StepSeconds,
		Batches: r.Batches, Items: r.Items, EpochEnd: r.EpochEnd}, src)
}

// EpochsDone is how many epochs every job with a complete epoch has done
// (the least among them): split.Auto plans as it grows.
func (m MemorySplit) EpochsDone() uint64 {
	n := m.n
	done, any := uint64(math.MaxUint64), false
	for _, j := range n.split.book.Jobs() {
		if j.Last.Batches > 0 {
			done, any = min(done, j.Epochs), true
		}
	}
	if !any {
		return 0
	}
	return done
}

// SplitPlan splits the cluster's cache memory between the datasets of the jobs
// that reported a complete epoch to this node. Figures this node measures
// for its share of a dataset (storage bytes and throughput, bytes cached)
// are scaled to the cluster by that share: every node reads and holds its
// own share at the same time.
func (m MemorySplit) SplitPlan(_ context.Context) (api.Plan, error) {
	n := m.n
	in := planner.Input{Datasets: map[string]planner.Dataset{}}
	out := api.Plan{Jobs: []api.PlanJob{}, Split: map[string]uint64{}, Datasets: []api.PlanDataset{}}
	stats := map[string]split.JobStats{}
	shares := map[string]float64{}
	minItem := math.Inf(1)
	for _, js := range n.split.book.Jobs() {
		if js.Last.Batches == 0 {
			continue // no complete epoch yet
		}
		d, ok := n.cat.Dataset(js.Dataset)
		if !ok {
			continue
		}
		if _, seen := in.Datasets[d.Name]; !seen {
			share := m.shareOf(d)
			shares[d.Name] = share
			cached := float64(n.store.DatasetBytes(d.ID)) / share
			cur := cached
			if d.Quota != nil {
				cur = float64(*d.Quota)
			}
			bytes := float64(d.Manifest.TotalBytes())
			bps := storageRate(n.split.meter.Rate(d.ID), float64(n.cfg.SourceRate))
			in.Datasets[d.Name] = planner.Dataset{Name: d.Name, Bytes: bytes, StorageBps: bps / share,
				Cached: math.Min(cached, bytes), Current: math.Min(cur, bytes)}
			if d.Manifest.Len() > 0 {
				minItem = math.Min(minItem, bytes/float64(d.Manifest.Len()))
			}
			out.Datasets = append(out.Datasets, api.PlanDataset{Dataset: d.Name, Bytes: uint64(bytes), CachedBytes: uint64(cached),
				Quota: d.Quota, StorageBytesPerS: in.Datasets[d.Name].StorageBps, HitRatio: math.Min(1, cached/math.Max(bytes, 1))})
		}
		stats[js.Job] = js
		in.Jobs = append(in.Jobs, planner.Job{Name: js.Job, Dataset: d.Name, Ranks: js.Ranks, EpochS: js.Last.Seconds(),
			StepS: js.Last.StepS, Items: float64(js.Last.Items), Batches: float64(js.Last.Batches), MissBytes: float64(js.Last.MissBytes) / shares[d.Name]})
	}
	// The memory to split: the cluster's, less what datasets no reporting
	// job reads hold, less each item's bookkeeping (the store charges it to
	// the budget; quotas count payload bytes).
	memory := float64(m.ClusterMemory())
	for _, d := range n.cat.Datasets() {
		if _, ok := in.Datasets[d.Name]; !ok {
			memory -= float64(n.store.DatasetBytes(d.ID)) / m.shareOf(d)
		}
	}
	if !math.IsInf(minItem, 1) {
		memory *= minItem / (minItem + store.EntryOverhead + 64)
	}
	in.Memory = math.Max(0, memory)
	p := planner.Split(in)
	out.MemoryBytes = uint64(in.Memory)
	out.PredictedSaving = p.Saving
	for _, name := range slices.Sorted(maps.Keys(p.Split)) {
		out.Split[name] = uint64(p.Split[name])
	}
	for _, r := range p.Jobs {
		js := stats[r.Job]
		out.Jobs = append(out.Jobs, api.PlanJob{Job: r.Job, Dataset: r.Dataset, EpochS: r.EpochS, EpochSPredicted: r.EpochSPredicted,
			CachedBytes: uint64(r.CachedBytes), KneeBytes: uint64(r.KneeBytes), SecondsSavedPerGiB: r.SecondsSavedPerGiB,
			EpochSNow: r.EpochSNow, StepS: js.Last.StepS, WaitS: js.Last.WaitS, MissBytes: uint64(float64(js.Last.MissBytes) / shares[r.Dataset]),
			Ranks: js.Ranks, Epochs: js.Epochs})
	}
	return out, nil
}

// storageRate is the storage throughput a plan counts on: the measured one
// (0 when nothing was read yet), capped by --source-rate where that is set.
// A throttled source gives a short burst after each pause: a job whose
// misses come in spurts measures more than the rate, which would not hold
// once it is given less cache and its misses come back to back.
func storageRate(measured, limit float64) float64 {
	if limit <= 0 {
		return measured
	}
	if measured == 0 {
		return limit
	}
	return math.Min(measured, limit)
}

// ApplySplit sets the quotas of a plan's split.
func (m MemorySplit) ApplySplit(ctx context.Context, p api.Plan) error {
	for _, name := range slices.Sorted(maps.Keys(p.Split)) {
		if d, ok := m.n.cat.Dataset(name); ok && d.Derived() {
			continue // takes no quota (400): its items are evicted first, whatever the split
		}
		if _, _, err := m.PutQuota(ctx, name, "", api.QuotaOf(int64(p.Split[name]))); err != nil {
			return fmt.Errorf("quota of %s: %w", name, err)
		}
	}
	return nil
}
