// Package stall simulates training loaders against a live cluster and
// analyses data stalls the way DS-Analyzer does (Mohan et al., VLDB 2021):
// measure ingestion rates differentially (from memory, from the cluster's
// cache, cold from storage), then predict epoch time and stall for other
// cache sizes and policies.
package stall

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"stallfree/client"
)

// ReadOptions shape a Read.
type ReadOptions struct {
	Workers int
	Bypass  bool                   // read storage uncached (?cache=bypass)
	Check   func(client.Item) bool // when set, counts items it rejects
}

// ReadResult is what a Read saw.
type ReadResult struct {
	Elapsed time.Duration
	Bytes   int64
	Caches  []string // X-Cache of each index, in order
	Wrong   int      // items Check rejected
}

// Count returns how many items came back with X-Cache c.
func (r ReadResult) Count(c string) int {
	n := 0
	for _, x := range r.Caches {
		if x == c {
			n++
		}
	}
	return n
}

// Read fetches the indices through c with several workers, like a data
// loader, and reports time, bytes and where each item came from.
func Read(ctx context.Context, c *client.Client, dataset string, indices []int, opt ReadOptions) (ReadResult, error) {
	var next, nbytes, wrong atomic.Int64
	res := ReadResult{Caches: make([]string, len(indices))}
	var firstErr error
	var once sync.Once
	var wg sync.WaitGroup
	start := time.Now()
	for range max(opt.Workers, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				j := int(next.Add(1) - 1)
				if j >= len(indices) || ctx.Err() != nil {
					return
				}
				var it client.Item
				var err error
				if opt.Bypass {
					it, err = c.ItemByIndexUncached(ctx, dataset, indices[j])
				} else {
					it, err = c.ItemByIndex(ctx, dataset, indices[j])
				}
				if err != nil {
					once.Do(func() { firstErr = err })
					return
				}
				nbytes.Add(int64(len(it.Data)))
				res.Caches[j] = it.Cache
				if opt.Check != nil && !opt.Check(it) {
					wrong.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	res.Elapsed, res.Bytes, res.Wrong = time.Since(start), nbytes.Load(), int(wrong.Load())
	return res, firstErr
}

// Rates are ingestion rates in items per second, measured with one loader
// of a given number of workers.
type Rates struct {
	Memory float64 `json:"memory_items_per_s"` // items in the asked node's own memory
	Cached float64 `json:"cached_items_per_s"` // items anywhere in the cluster's memory (local and peer)
	Cold   float64 `json:"cold_items_per_s"`   // items read from storage
	// ItemBytes is the mean item size in the samples.
	ItemBytes float64 `json:"item_bytes"`
}

// Scenario is one row of the what-if table.
type Scenario struct {
	Policy       string  `json:"policy"`
	CacheFr      float64 `json:"cache_fraction"`
	CacheBytes   int64   `json:"cache_bytes"`
	HitRate      float64 `json:"hit_rate"`
	EpochSeconds float64 `json:"epoch_seconds"`
	StallSeconds float64 `json:"stall_seconds"`
}

// Model predicts epochs of n items for a consumer (the GPU) of gpuRate items
// per second (0 = infinitely fast: every second of fetching is stall).
type Model struct {
	Rates   Rates   `json:"rates"`
	Items   int     `json:"items"`
	Bytes   int64   `json:"bytes"`
	GPURate float64 `json:"gpu_items_per_s"`
}

// FetchSeconds is the time to fetch an epoch when a fraction hit of the
// requests hit the cluster's memory and the rest go to storage. A loader's
// workers overlap the two: while some wait on storage, which is bound by its
// bandwidth, the others are served from memory, so an epoch takes the longer
// of the misses at the cold rate and every item at the cached rate.
// DS-Analyzer's serial mix (hit/Cached + (1-hit)/Cold) is exact only for one
// worker; with the 8 workers of `cachectl analyze` it over-predicted a
// half-memory epoch by 7-15%, this model by 1-2% (TestAnalyzePredictsHalfMemory).
// MinIO's hit rate is exactly the cached fraction of the dataset, which makes
// the model sound for it.
func (m Model) FetchSeconds(hit float64) float64 {
	return math.Max(float64(m.Items)*(1-hit)/m.Rates.Cold, float64(m.Items)/m.Rates.Cached)
}

func (m Model) gpuSeconds() float64 {
	if m.GPURate <= 0 {
		return 0
	}
	return float64(m.Items) / m.GPURate
}

// Predict returns epoch time and stall for a policy at a cache fraction.
// With a pipelined loader the GPU and fetching overlap, so an epoch takes
// the longer of the two and the stall is the excess of fetching.
// Clairvoyant reads as many items from storage as MinIO, only ahead of the
// loader: on bandwidth-bound storage its epoch is MinIO's (it hides
// latency, which the loader's workers already overlap here).
func (m Model) Predict(policy string, fr float64) Scenario {
	fr = math.Max(0, math.Min(1, fr))
	s := Scenario{Policy: policy, CacheFr: fr, CacheBytes: int64(fr * float64(m.Bytes)), HitRate: fr}
	fetch := m.FetchSeconds(fr)
	gpu := m.gpuSeconds()
	s.EpochSeconds = math.Max(fetch, gpu)
	s.StallSeconds = s.EpochSeconds - gpu
	return s
}

// MemoryToRemoveStall is the smallest cache (bytes) at which MinIO's
// fetching keeps up with the GPU; -1 when even a full cache does not.
func (m Model) MemoryToRemoveStall() int64 {
	if m.GPURate <= 0 {
		return -1
	}
	if m.Rates.Cached < m.GPURate {
		return -1
	}
	if m.Rates.Cold >= m.GPURate {
		return 0
	}
	// Misses at the cold rate keep up with the GPU once (1-fr)/Cold <= 1/GPU.
	fr := 1 - m.Rates.Cold/m.GPURate
	return int64(math.Ceil(fr * float64(m.Bytes)))
}

// Analysis is what cachectl analyze reports.
type Analysis struct {
	Dataset   string     `json:"dataset"`
	Model     Model      `json:"model"`
	Workers   int        `json:"workers"`
	Sample    int        `json:"sample"`
	ColdStall float64    `json:"cold_stall_seconds"`
	WarmStall float64    `json:"cached_stall_seconds"`
	WhatIf    []Scenario `json:"what_if"`
	// MemoryNeeded is the cache that removes the stall with MinIO (-1: none does).
	MemoryNeeded int64 `json:"memory_to_remove_stall"`
}

// Analyze measures the three rates on a random sample of the dataset through
// c (reading storage uncached for the cold rate, warming the cluster for the
// cached ones) and builds the what-if table.
func Analyze(ctx context.Context, c *client.Client, members []*client.Client, dataset string, sample, workers int, gpuRate float64) (*Analysis, error) {
	d, err := c.Dataset(ctx, dataset)
	if err != nil {
		return nil, err
	}
	sample = min(max(sample, 1), d.Items)
	idx := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 1)).Perm(d.Items)[:sample]

	cold, err := Read(ctx, c, dataset, idx, ReadOptions{Workers: workers, Bypass: true})
	if err != nil {
		return nil, fmt.Errorf("cold pass: %w", err)
	}
	r := Rates{Cold: float64(sample) / cold.Elapsed.Seconds(), ItemBytes: float64(cold.Bytes) / float64(sample)}

	for _, m := range members {
		if _, err := m.StartWarmup(ctx, dataset); err != nil {
			return nil, err
		}
	}
	for _, m := range members {
		for {
			p, err := m.Warmup(ctx, dataset)
			if err != nil {
				return nil, err
			}
			if !p.Running {
				break
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(100 * time.Millisecond):
			}
		}
	}
	// A cache smaller than the dataset leaves some of the sample uncached:
	// time the cached rate on the items that the cluster did hold.
	warm, err := Read(ctx, c, dataset, idx, ReadOptions{Workers: workers})
	if err != nil {
		return nil, fmt.Errorf("cached pass: %w", err)
	}
	var cached, local []int
	for j, cache := range warm.Caches {
		switch cache {
		case "hit":
			local = append(local, idx[j])
			cached = append(cached, idx[j])
		case "peer":
			cached = append(cached, idx[j])
		}
	}
	if len(cached) == 0 {
		return nil, fmt.Errorf("nothing of %s stayed in the cluster's memory after warm-up", dataset)
	}
	rate := func(items []int) (float64, error) {
		res, err := Read(ctx, c, dataset, items, ReadOptions{Workers: workers})
		return float64(len(items)) / res.Elapsed.Seconds(), err
	}
	if r.Cached, err = rate(cached); err != nil {
		return nil, fmt.Errorf("cached pass: %w", err)
	}
	r.Memory = r.Cached
	if len(local) > 0 {
		if r.Memory, err = rate(local); err != nil {
			return nil, fmt.Errorf("memory pass: %w", err)
		}
	}
	m := Model{Rates: r, Items: d.Items, Bytes: d.Bytes, GPURate: gpuRate}
	a := &Analysis{Dataset: dataset, Model: m, Workers: workers, Sample: sample,
		ColdStall: m.Predict("minio", 0).StallSeconds, WarmStall: m.Predict("minio", 1).StallSeconds,
		MemoryNeeded: m.MemoryToRemoveStall()}
	for _, fr := range []float64{0, 0.25, 0.5, 0.75, 1} {
		a.WhatIf = append(a.WhatIf, m.Predict("minio", fr))
	}
	for _, fr := range []float64{0.25, 0.5, 0.75} {
		a.WhatIf = append(a.WhatIf, m.Predict("clairvoyant", fr))
	}
	return a, nil
}
