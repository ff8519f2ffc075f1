package bench

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"

	"stallfree/client"
	"stallfree/stall"
)

// AnalyzeResult compares cachectl analyze's prediction for a cache of half
// the dataset with an epoch measured on a node that has that much memory.
type AnalyzeResult struct {
	Items       int     `json:"items"`
	ItemBytes   int     `json:"item_bytes"`
	SourceRate  string  `json:"source_rate"`
	Workers     int     `json:"workers"`
	ColdRate    float64 `json:"cold_items_per_s"`
	CachedRate  float64 `json:"cached_items_per_s"`
	HitFraction float64 `json:"hit_fraction"`
	Predicted   float64 `json:"predicted_s"`
	Measured    float64 `json:"measured_s"`
	ErrorFr     float64 `json:"error_fraction"`
}

// Analyze measures the rates on one node with the full dataset cached, then
// times the second epoch of a node holding half of it, storage throttled
// like a disk in both. The prediction is made for the hit fraction that
// node really reached, so the figure is the model's error alone.
func Analyze(work, bin string) (*AnalyzeResult, error) {
	const items, size, rate, workers = 400, 16 << 10, "4MB", 8
	dir := work + "/analyze-data"
	if err := writeItems(dir, items, size); err != nil {
		return nil, err
	}
	ctx := context.Background()
	res := &AnalyzeResult{Items: items, ItemBytes: size, SourceRate: rate, Workers: workers}
	full, err := startNode(work, bin, "analyze-full", "64MiB", "", "--source-rate", rate)
	if err != nil {
		return nil, err
	}
	defer full.stop()
	if err := register(full, "ds", dir); err != nil {
		return nil, err
	}
	an, err := stall.Analyze(ctx, full.c, []*client.Client{full.c}, "ds", 200, workers, 600)
	if err != nil {
		return nil, err
	}
	full.stop()
	res.ColdRate, res.CachedRate = an.Model.Rates.Cold, an.Model.Rates.Cached

	half := strconv.Itoa((items * (size + 64 + 128)) / 2)
	n, err := startNode(work, bin, "analyze-half", half, "", "--source-rate", rate)
	if err != nil {
		return nil, err
	}
	defer n.stop()
	if err := register(n, "ds", dir); err != nil {
		return nil, err
	}
	for e := range 2 {
		order := rand.New(rand.NewPCG(uint64(e), 5)).Perm(items)
		rd, err := stall.Read(ctx, n.c, "ds", order, stall.ReadOptions{Workers: workers})
		if err != nil {
			return nil, err
		}
		if e == 0 {
			continue // fills the cache
		}
		res.HitFraction = float64(rd.Count("hit")) / items
		res.Predicted = an.Model.FetchSeconds(res.HitFraction)
		res.Measured = rd.Elapsed.Seconds()
	}
	if res.Measured == 0 {
		return nil, fmt.Errorf("the half-memory epoch took no time")
	}
	res.ErrorFr = math.Abs(res.Measured-res.Predicted) / res.Measured
	return res, nil
}
