// Package locality computes a training job's locality-aware sample order.
//
// For epoch e the global order is a permutation of the dataset seeded by
// (seed, e), cut into global minibatches of batch_size × world_size. Which rank
// processes which sample of a global minibatch does not change the averaged
// gradient, so each sample goes to a rank on the node that owns it; every rank
// still gets exactly batch_size samples, and only the surplus of over-full
// nodes crosses the network (Yang & Cong, HiPC 2019). Every epoch stays a
// permutation, and every global minibatch is the same set plain seeded
// sampling gives.
package locality

import (
	"errors"
	"math/bits"
	"math/rand/v2"
)

// below returns a uniform value in [0, n) from src (Lemire's method,
// unbiased). It is spelled out, as is the shuffle, because math/rand/v2 fixes
// the PCG stream but not the algorithms of IntN, Perm or Shuffle: the order of
// a registered job must never change with the Go version.
func below(src *rand.PCG, n uint64) uint64 {
	hi, lo := bits.Mul64(src.Uint64(), n)
	if lo < n {
		thresh := -n % n
		for lo < thresh {
			hi, lo = bits.Mul64(src.Uint64(), n)
		}
	}
	return hi
}

// Permutation is the global order of epoch e: a Fisher–Yates shuffle of
// [0, n) seeded by (seed, epoch).
func Permutation(n int, seed uint64, epoch uint64) []int32 {
	src := rand.NewPCG(seed, epoch^0x9e3779b97f4a7c15)
	perm := make([]int32, n)
	for i := range perm {
		perm[i] = int32(i)
	}
	for i := n - 1; i > 0; i-- {
		j := below(src, uint64(i+1))
		perm[i], perm[j] = perm[j], perm[i]
	}
	return perm
}

// Plan is one epoch's order for every rank.
type Plan struct {
	BatchSize int
	Ranks     [][]int32
	// Remote counts, per rank, the samples that live on another node.
	Remote []int
}

// Batches is the number of minibatches of a rank (the last may be smaller).
func (p *Plan) Batches() int {
	if len(p.Ranks) == 0 {
		return 0
	}
	return (len(p.Ranks[0]) + p.BatchSize - 1) / p.BatchSize
}

// Batch returns minibatch b of rank r.
func (p *Plan) Batch(r, b int) []int32 {
	o := p.Ranks[r]
	start := b * p.BatchSize
	return o[start:min(start+p.BatchSize, len(o))]
}

// Assign computes the plan. rankNode[r] names the node rank r runs on ("" or
// an unknown node: no locality); owner tells which node holds a sample.
//
// The full global minibatches give each rank batchSize samples. The samples
// after the last full one are shared out too, floor(rest/worldSize) to each
// rank, so every rank gets floor(n/worldSize) samples like a
// DistributedSampler; the final rest % worldSize samples of the order are
// dropped, the same ones on every node.
func Assign(perm []int32, worldSize, batchSize int, rankNode []string, owner func(int32) string) (*Plan, error) {
	if worldSize < 1 || batchSize < 1 {
		return nil, errors.New("locality: world size and batch size must be positive")
	}
	if len(rankNode) != 0 && len(rankNode) != worldSize {
		return nil, errors.New("locality: one node per rank, or none")
	}
	n := len(perm)
	per := n / worldSize
	p := &Plan{BatchSize: batchSize, Ranks: make([][]int32, worldSize), Remote: make([]int, worldSize)}
	for r := range p.Ranks {
		p.Ranks[r] = make([]int32, 0, per)
	}
	nodeRanks := map[string][]int{}
	for r, node := range rankNode {
		if node != "" {
			nodeRanks[node] = append(nodeRanks[node], r)
		}
	}
	global := batchSize * worldSize
	a := assigner{p: p, nodeRanks: nodeRanks, left: make([]int, worldSize), next: map[string]int{}, owner: owner}
	for start := 0; start < n; start += global {
		quota := batchSize
		end := start + global
		if end > n {
			quota = (n - start) / worldSize
			end = start + quota*worldSize
		}
		if quota == 0 {
			break
		}
		a.batch(perm[start:end], quota)
	}
	return p, nil
}

type assigner struct {
	p         *Plan
	nodeRanks map[string][]int
	left      []int          // capacity left per rank in the current global batch
	next      map[string]int // round-robin position among a node's ranks
	owner     func(int32) string
	overflow  []int32
}

// batch shares one global minibatch: samples go to a rank on their owner's
// node while it has room; the surplus then fills the ranks still short. This
// minimises the samples that cross nodes.
func (a *assigner) batch(samples []int32, quota int) {
	for r := range a.left {
		a.left[r] = quota
	}
	a.overflow = a.overflow[:0]
	for _, s := range samples {
		node := a.owner(s)
		if r, ok := a.localRank(node); ok {
			a.p.Ranks[r] = append(a.p.Ranks[r], s)
			a.left[r]--
			continue
		}
		a.overflow = append(a.overflow, s)
	}
	r := 0
	for _, s := range a.overflow {
		for a.left[r] == 0 {
			r++
		}
		a.p.Ranks[r] = append(a.p.Ranks[r], s)
		a.p.Remote[r]++
		a.left[r]--
	}
}

// localRank picks, round robin, a rank with room on node.
func (a *assigner) localRank(node string) (int, bool) {
	ranks := a.nodeRanks[node]
	for range ranks {
		i := a.next[node] % len(ranks)
		a.next[node] = i + 1
		if r := ranks[i]; a.left[r] > 0 {
			return r, true
		}
	}
	return 0, false
}
