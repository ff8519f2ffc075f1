package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"stallfree/api"
	"stallfree/locality"
	"stallfree/node"
	"stallfree/partition"
)

// PolicyResult is a cache policy's storage reads and loader misses per
// epoch when a job reads in its own order.
type PolicyResult struct {
	Policy   string    `json:"policy"`
	CacheFr  float64   `json:"cache_fraction"`
	Items    int       `json:"items"`
	Reads    []uint64  `json:"reads_per_epoch"`
	Misses   []uint64  `json:"misses_per_epoch"`
	ReadsFr  []float64 `json:"reads_fraction"`
	MissesFr []float64 `json:"misses_fraction"`
}

// Policies runs a one-node cluster per (policy, cache fraction) over a
// dataset of equal-size files, a job of batch 50, three epochs, pausing per
// batch as a GPU would.
func Policies(work string, items, size int, fractions []float64, pause time.Duration) ([]PolicyResult, error) {
	dir := filepath.Join(work, "policy-data")
	if err := writeItems(dir, items, size); err != nil {
		return nil, err
	}
	var out []PolicyResult
	for _, fr := range fractions {
		for _, pol := range []string{"minio", "lru", "clairvoyant"} {
			r, err := policyRun(work, dir, pol, fr, items, size, pause)
			if err != nil {
				return nil, fmt.Errorf("%s at %.2f: %w", pol, fr, err)
			}
			out = append(out, r)
		}
	}
	return out, nil
}

func policyRun(work, dir, pol string, fr float64, items, size int, pause time.Duration) (PolicyResult, error) {
	state, _ := os.MkdirTemp(work, "policy-state")
	defer os.RemoveAll(state)
	mem := uint64(fr * float64(items) * float64(size+128))
	n, err := node.New(node.Config{Name: "sim", RaftBind: freePort(), DataDir: state, Bootstrap: true, Memory: mem,
		Policy: pol, Timing: node.LocalTiming(), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return PolicyResult{}, err
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := n.Control().RegisterAtStart(ctx, []string{"sim=" + dir}); err != nil {
		return PolicyResult{}, err
	}
	if _, err := n.Control().PutJob(ctx, api.Job{Name: "j", Dataset: "sim", Seed: 1, WorldSize: 1, BatchSize: 50, Ranks: []string{"sim"}}); err != nil {
		return PolicyResult{}, err
	}
	res := PolicyResult{Policy: pol, CacheFr: fr, Items: items}
	for e := range 3 {
		ep, err := n.Control().Plan(ctx, "j", uint64(e))
		if err != nil {
			return res, err
		}
		time.Sleep(20 * time.Millisecond) // a loader's set_epoch; the prefetcher sees the pin
		before := n.Stats()
		for b := range ep.Batches() {
			batch := ep.Batch(0, b)
			idx := make([]int, len(batch))
			for j, i := range batch {
				idx[j] = int(i)
			}
			got, err := n.GetManyFor(ctx, ep.Data, idx, "")
			if err != nil {
				return res, err
			}
			for j := range got {
				got[j].Release()
			}
			time.Sleep(pause)
		}
		after := n.Stats()
		res.Reads = append(res.Reads, after.SourceReads-before.SourceReads)
		res.Misses = append(res.Misses, after.Misses-before.Misses)
		res.ReadsFr = append(res.ReadsFr, float64(after.SourceReads-before.SourceReads)/float64(items))
		res.MissesFr = append(res.MissesFr, float64(after.Misses-before.Misses)/float64(items))
	}
	return res, nil
}

// LocalityResult is the share of a rank's samples that live on another node.
type LocalityResult struct {
	Nodes    int     `json:"nodes"`
	Batch    int     `json:"batch"`
	Locality float64 `json:"locality_aware"`
	Plain    float64 `json:"plain"`
}

// Locality computes remote fractions for ImageNet-like keys.
func Locality(items int, nodeCounts, batches []int) ([]LocalityResult, error) {
	keys := make([]string, items)
	for i := range keys {
		keys[i] = fmt.Sprintf("train/n%05d/img_%07d.JPEG", i%1000, i)
	}
	var out []LocalityResult
	for _, nn := range nodeCounts {
		var names []string
		for i := range nn {
			names = append(names, fmt.Sprintf("node-%d", i))
		}
		ring, err := partition.New(names)
		if err != nil {
			return nil, err
		}
		owner := func(i int32) string { return ring.Owner("imagenet", keys[i]) }
		for _, b := range batches {
			perm := locality.Permutation(items, 1, 0)
			p, err := locality.Assign(perm, nn, b, names, owner)
			if err != nil {
				return nil, err
			}
			remote, total, plain := 0, 0, 0
			per := items / nn
			for r := range p.Ranks {
				remote += p.Remote[r]
				total += len(p.Ranks[r])
				for _, s := range perm[r*per : (r+1)*per] {
					if owner(s) != names[r] {
						plain++
					}
				}
			}
			out = append(out, LocalityResult{Nodes: nn, Batch: b, Locality: float64(remote) / float64(total), Plain: float64(plain) / float64(total)})
		}
	}
	return out, nil
}

func writeItems(dir string, n, size int) error {
	buf := make([]byte, size)
	for i := range n {
		sub := filepath.Join(dir, fmt.Sprintf("c%02d", i%16))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			return err
		}
		for j := range buf {
			buf[j] = byte(i*31 + j)
		}
		if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("i%07d.bin", i)), buf, 0o644); err != nil {
			return err
		}
	}
	return nil
}

func selfPID() int { return os.Getpid() }
