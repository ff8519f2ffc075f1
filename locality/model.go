package locality

import "math"

// ExpectedRemote is the traffic model of Assign: the expected fraction of an
// epoch's samples that ranks read from another node.
//
// In each global minibatch of G = Σ demand samples, node i owns X_i of them,
// X_i ~ Binomial(G, share[i]), and its ranks need demand[i] (ranks on the
// node × batch size). Assign gives a node's ranks its own samples first, so
// the remote reads are the shortfalls: Σ E[max(0, demand[i] − X_i)] / G.
// With X_i taken as normal (mean μ = G·p, deviation σ = √(G·p·(1−p))),
// E[max(0, d − X)] = (d − μ)·Φ(z) + σ·φ(z), z = (d − μ)/σ.
//
// For k nodes with equal shares and one rank of batch b each this is
// φ(0)·√((1 − 1/k)/b) ≈ 0.4·√((1 − 1/k)/b), Yang & Cong's estimate; unequal
// shares (a consistent-hash ring is never exact) add about half the L1
// distance between the shares and the demands' proportions.
func ExpectedRemote(share []float64, demand []int) float64 {
	var g float64
	for _, d := range demand {
		g += float64(d)
	}
	if g == 0 || len(share) != len(demand) {
		return math.NaN()
	}
	var short float64
	for i, p := range share {
		d, mu := float64(demand[i]), g*p
		sigma := math.Sqrt(g * p * (1 - p))
		if sigma == 0 {
			short += math.Max(0, d-mu)
			continue
		}
		z := (d - mu) / sigma
		short += (d-mu)*0.5*math.Erfc(-z/math.Sqrt2) + sigma*math.Exp(-z*z/2)/math.Sqrt(2*math.Pi)
	}
	return short / g
}
