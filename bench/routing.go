package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"time"
)

// RoutingResult compares three ways of reading a warm dataset at random on a
// cluster of Nodes members (the same Go load client for all): every request
// through one node, each request sent to its item's owner (by the owner
// table, as Client(route="owner") does), and the all-local reference, one
// node's own items read from it. CPU per request is the sum over the nodes.
type RoutingResult struct {
	Nodes          int     `json:"nodes"`
	OneNode        Result  `json:"through_one_node"`
	Routed         Result  `json:"owner_routed"`
	AllLocal       Result  `json:"all_local"`
	RoutedVsLocal  float64 `json:"routed_vs_all_local"`
	OneNodeVsLocal float64 `json:"one_node_vs_all_local"`
}

// Routing measures RoutingResult on a fresh cluster of n nodes.
func Routing(c *Config, dataDir string, items, n int) (*RoutingResult, error) {
	mem := fmt.Sprintf("%dMiB", items*(c.Size+4096)>>20+64)
	nodes, err := startCluster(c, "r", n, mem, nil)
	defer nodes.stop()
	if err != nil {
		return nil, err
	}
	if err := register(nodes[0], "bench", dataDir); err != nil {
		return nil, err
	}
	if err := warm(nodes, "bench"); err != nil {
		return nil, err
	}
	table, err := nodes[0].c.Owners(context.Background(), "bench")
	if err != nil {
		return nil, err
	}
	if len(table.Members) != n || len(table.Owners) != items {
		return nil, fmt.Errorf("owner table of %d members and %d items, want %d and %d", len(table.Members), len(table.Owners), n, items)
	}
	var addrs []string
	for _, m := range table.Members {
		addrs = append(addrs, m.HTTP)
	}
	first := -1
	for j, m := range table.Members {
		if m.Name == nodes[0].name {
			first = j
		}
	}
	paths, route := make([]string, items), make([]int, items)
	var own []string
	for i := range items {
		paths[i] = fmt.Sprintf("/v1/datasets/bench/index/%d", i)
		route[i] = int(table.Owners[i])
		if route[i] == first {
			own = append(own, paths[i])
		}
	}
	all := nodes.pids
	name := func(s string) string { return fmt.Sprintf("%s-%dn", s, n) }
	targets := []*Target{
		HTTPGet(name("through-one-node"), nodes[0].http, all, paths, ""),
		HTTPGetRouted(name("owner-routed"), addrs, all, paths, route),
		HTTPGet(name("all-local"), nodes[0].http, all, own, ""),
	}
	runs, err := rounds(c, targets)
	if err != nil {
		return nil, err
	}
	res := &RoutingResult{Nodes: n, OneNode: median(runs, targets[0].Name), Routed: median(runs, targets[1].Name),
		AllLocal: median(runs, targets[2].Name)}
	res.RoutedVsLocal = res.Routed.ItemsPerSec / res.AllLocal.ItemsPerSec
	res.OneNodeVsLocal = res.OneNode.ItemsPerSec / res.AllLocal.ItemsPerSec
	return res, nil
}

// BatchSizeResult is batch64 against single GETs on one node for one item size.
type BatchSizeResult struct {
	Size   int     `json:"size"`
	Single Result  `json:"single"`
	Batch  Result  `json:"batch64"`
	Ratio  float64 `json:"batch_vs_single"`
}

// BatchSizes measures BatchSizeResult for each size on a fresh node.
func BatchSizes(c *Config, items int, sizes []int) ([]BatchSizeResult, error) {
	var out []BatchSizeResult
	for _, size := range sizes {
		dir := filepath.Join(c.Work, fmt.Sprintf("data-%d", size))
		keys, err := WriteFixed(dir, items, size)
		if err != nil {
			return nil, err
		}
		r, err := batchSize(c, dir, keys, size)
		if err != nil {
			return nil, err
		}
		out = append(out, *r)
	}
	return out, nil
}

func batchSize(c *Config, dir string, keys []string, size int) (*BatchSizeResult, error) {
	mem := fmt.Sprintf("%dMiB", len(keys)*(size+4096)>>20+64)
	nd, err := startNode(c.Work, filepath.Join(c.Bin, "cachenode"), fmt.Sprintf("s%d", size), mem, "")
	if err != nil {
		return nil, err
	}
	defer nd.stop()
	if err := register(nd, "bench", dir); err != nil {
		return nil, err
	}
	if err := warm([]*nodeProc{nd}, "bench"); err != nil {
		return nil, err
	}
	paths := make([]string, len(keys))
	for i := range keys {
		paths[i] = fmt.Sprintf("/v1/datasets/bench/index/%d", i)
	}
	body := func(r *rand.Rand) []byte {
		idx := make([]int, 64)
		for i := range idx {
			idx[i] = r.IntN(len(keys))
		}
		b, _ := json.Marshal(map[string][]int{"indices": idx})
		return b
	}
	single := HTTPGet(fmt.Sprintf("single-%d", size), nd.http, nd.pids, paths, "")
	batch := HTTPPost(fmt.Sprintf("batch64-%d", size), nd.http, nd.pids, "/v1/datasets/bench/batch", 64, "", body)
	runs, err := rounds(c, []*Target{single, batch})
	if err != nil {
		return nil, err
	}
	res := &BatchSizeResult{Size: size, Single: median(runs, single.Name), Batch: median(runs, batch.Name)}
	res.Ratio = res.Batch.ItemsPerSec / res.Single.ItemsPerSec
	return res, nil
}

// rounds runs the targets alternately, after a short warming run of each, in
// c.Rounds rounds of c.Duration (at most 3: these sections add up).
func rounds(c *Config, targets []*Target) ([]Result, error) {
	for _, t := range targets {
		if _, err := Run(t, c.Conc, time.Second/2); err != nil {
			return nil, err
		}
	}
	var runs []Result
	for round := range min(c.Rounds, 3) {
		for _, t := range targets {
			res, err := Run(t, c.Conc, c.Duration)
			if err != nil {
				return nil, err
			}
			runs = append(runs, res)
			c.logf("round %d %-26s %8.0f items/s cpu %5.1fµs/req err %d", round, t.Name, res.ItemsPerSec, res.CPUusPerReq, res.Errors)
		}
	}
	return runs, nil
}
