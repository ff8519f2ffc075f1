package stall

import (
	"context"
	"fmt"
	"sync"
	"time"

	"stallfree/client"
)

// SimConfig describes a simulated training job: every rank runs on its node,
// fetches its minibatches ahead with Workers requests in flight, and spends
// GPUPerBatch on each one, as a GPU would.
type SimConfig struct {
	Job         string
	Epochs      int
	FirstEpoch  int
	Workers     int
	GPUPerBatch time.Duration
	// Nodes maps node names (as in the job's ranks) to clients.
	Nodes map[string]*client.Client
	// Default serves ranks that name no known node.
	Default *client.Client
	// RouteByOwner fetches each minibatch from the owners of its items (split
	// by owner, in parallel) instead of through the rank's node.
	RouteByOwner bool
}

// EpochReport is one epoch of a simulated job, summed over ranks.
type EpochReport struct {
	Epoch        int     `json:"epoch"`
	Seconds      float64 `json:"seconds"`
	Items        int     `json:"items"`
	ItemsPerSec  float64 `json:"items_per_s"`
	MBPerSec     float64 `json:"mb_per_s"`
	Local        uint64  `json:"hits_local"`
	Peer         uint64  `json:"hits_peer"`
	Miss         uint64  `json:"misses"`
	RemoteFr     float64 `json:"remote_fraction"`
	StallSeconds float64 `json:"stall_seconds"` // mean over ranks of time the GPU waited
	StallFr      float64 `json:"stall_fraction"`
}

// RunJob simulates the job's epochs and reports each.
func RunJob(ctx context.Context, cfg SimConfig) ([]EpochReport, error) {
	spec, err := cfg.Default.Job(ctx, cfg.Job)
	if err != nil {
		return nil, err
	}
	if cfg.RouteByOwner {
		d, err := cfg.Default.Dataset(ctx, spec.Dataset)
		if err != nil {
			return nil, err
		}
		if d.Samples > 0 {
			return nil, fmt.Errorf("job %s reads tar samples; owner routing reads items (route the samples through the ranks' nodes)", cfg.Job)
		}
	}
	rankClient := func(r int) *client.Client {
		if r < len(spec.Ranks) {
			if c, ok := cfg.Nodes[spec.Ranks[r]]; ok {
				return c
			}
		}
		return cfg.Default
	}
	var out []EpochReport
	for e := cfg.FirstEpoch; e < cfg.FirstEpoch+cfg.Epochs; e++ {
		before, err := sumStats(ctx, cfg.Nodes)
		if err != nil {
			return nil, err
		}
		rep := EpochReport{Epoch: e}
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make(chan error, spec.WorldSize)
		var nbytes int64
		start := time.Now()
		for r := range spec.WorldSize {
			wg.Add(1)
			go func() {
				defer wg.Done()
				stall, items, b, remote, err := runRank(ctx, rankClient(r), cfg, spec.Dataset, e, r)
				if err != nil {
					errs <- fmt.Errorf("rank %d: %w", r, err)
					return
				}
				mu.Lock()
				rep.StallSeconds += stall.Seconds() / float64(spec.WorldSize)
				rep.Items += items
				nbytes += b
				rep.RemoteFr += float64(remote)
				mu.Unlock()
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			return nil, err
		}
		rep.Seconds = time.Since(start).Seconds()
		after, err := sumStats(ctx, cfg.Nodes)
		if err != nil {
			return nil, err
		}
		rep.Local, rep.Peer, rep.Miss = after.HitsLocal-before.HitsLocal, after.HitsPeer-before.HitsPeer, after.Misses-before.Misses
		rep.ItemsPerSec = float64(rep.Items) / rep.Seconds
		rep.MBPerSec = float64(nbytes) / rep.Seconds / 1e6
		if rep.Items > 0 {
			rep.RemoteFr /= float64(rep.Items)
		}
		rep.StallFr = rep.StallSeconds / rep.Seconds
		out = append(out, rep)
	}
	return out, nil
}

// runRank fetches a rank's batches in order, Workers ahead of a consumer
// that spends GPUPerBatch on each, and returns the time the consumer waited.
func runRank(ctx context.Context, c *client.Client, cfg SimConfig, dataset string, epoch, rank int) (time.Duration, int, int64, int, error) {
	o, err := c.RankOrder(ctx, cfg.Job, epoch, rank)
	if err != nil {
		return 0, 0, 0, 0, err
	}
	type result struct {
		items int
		bytes int64
		err   error
	}
	fetch := func(b int) (int, int64, error) { return fetchBatch(ctx, c, cfg.Job, epoch, rank, b) }
	if cfg.RouteByOwner {
		routed := *c
		routed.RouteByOwner()
		fetch = func(b int) (int, int64, error) {
			lo, hi := b*o.BatchSize, min((b+1)*o.BatchSize, len(o.Indices))
			items, err := routed.Batch(ctx, dataset, o.Indices[lo:hi])
			return len(items), bytesOf(items), err
		}
	}
	slots := make([]chan result, o.Batches)
	for b := range slots {
		slots[b] = make(chan result, 1)
	}
	sem := make(chan struct{}, max(cfg.Workers, 1))
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for b := range o.Batches {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				return
			}
			go func() {
				items, n, err := fetch(b)
				slots[b] <- result{items, n, err}
			}()
		}
	}()
	var stall time.Duration
	var items int
	var nbytes int64
	for b := range o.Batches {
		t0 := time.Now()
		var r result
		select {
		case r = <-slots[b]:
		case <-ctx.Done():
			return 0, 0, 0, 0, ctx.Err()
		}
		stall += time.Since(t0)
		<-sem
		if r.err != nil {
			return 0, 0, 0, 0, r.err
		}
		items += r.items
		nbytes += r.bytes
		if cfg.GPUPerBatch > 0 {
			time.Sleep(cfg.GPUPerBatch) // the GPU's time on this batch
		}
	}
	return stall, items, nbytes, o.Remote, nil
}

func fetchBatch(ctx context.Context, c *client.Client, job string, epoch, rank, b int) (int, int64, error) {
	items, err := c.JobBatch(ctx, job, epoch, rank, b)
	if err != nil {
		return 0, 0, err
	}
	return len(items), bytesOf(items), nil
}

func bytesOf(items []client.Item) int64 {
	var n int64
	for _, it := range items {
		n += int64(len(it.Data))
	}
	return n
}

func sumStats(ctx context.Context, nodes map[string]*client.Client) (client.Stats, error) {
	var t client.Stats
	for name, c := range nodes {
		s, err := c.Stats(ctx)
		if err != nil {
			return t, fmt.Errorf("%s: %w", name, err)
		}
		t.HitsLocal += s.HitsLocal
		t.HitsPeer += s.HitsPeer
		t.Misses += s.Misses
	}
	return t, nil
}
