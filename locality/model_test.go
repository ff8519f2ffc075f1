package locality

import (
	"fmt"
	"math"
	"testing"
)

// The model against Assign itself: k nodes with equal shares, one rank of
// batch b on each, items owned round-robin-at-random. The measured remote
// fraction of a 200-step epoch stays within a few standard errors of the
// prediction, and the closed form for equal shares is what the model gives.
func TestExpectedRemoteMatchesAssign(t *testing.T) {
	for _, c := range []struct{ k, b int }{{2, 16}, {4, 64}, {8, 32}, {16, 8}} {
		t.Run(fmt.Sprintf("k%d_b%d", c.k, c.b), func(t *testing.T) {
			n := 200 * c.k * c.b
			nodes := make([]string, c.k)
			for i := range nodes {
				nodes[i] = fmt.Sprintf("n%d", i)
			}
			// An owner per item from a hash of the item, as the ring does.
			owner := func(i int32) string { return nodes[mix(uint64(i))%uint64(c.k)] }
			plan, err := Assign(Permutation(n, 3, 0), c.k, c.b, nodes, owner)
			if err != nil {
				t.Fatal(err)
			}
			remote := 0
			for r, order := range plan.Ranks {
				for _, i := range order {
					if owner(i) != nodes[r] {
						remote++
					}
				}
			}
			got := float64(remote) / float64(n)
			share, demand := make([]float64, c.k), make([]int, c.k)
			for i := range share {
				share[i], demand[i] = 1/float64(c.k), c.b
			}
			want := ExpectedRemote(share, demand)
			closed := math.Sqrt((1-1/float64(c.k))/float64(c.b)) / math.Sqrt(2*math.Pi)
			if !near(want, closed, 1e-9) {
				t.Fatalf("model %.5f, closed form %.5f", want, closed)
			}
			t.Logf("k=%d b=%d: measured %.4f, model %.4f", c.k, c.b, got, want)
			// The normal approximation is coarse for small batches; the
			// per-step shortfalls average over 200 steps.
			if !near(got, want, 0.25*want+0.005) {
				t.Fatalf("measured remote fraction %.4f, model %.4f", got, want)
			}
		})
	}
	// All owned by one of two nodes with equal demand: half is remote.
	if got := ExpectedRemote([]float64{1, 0}, []int{8, 8}); !near(got, 0.5, 1e-9) {
		t.Fatalf("one node owning everything: %.3f remote, want 0.5", got)
	}
	if !math.IsNaN(ExpectedRemote([]float64{1}, []int{1, 2})) {
		t.Fatal("mismatched shares and demands must give NaN")
	}
	if !math.IsNaN(ExpectedRemote([]float64{0.5, 0.5}, []int{0, 0})) {
		t.Fatal("no demand must give NaN")
	}
}

// near is false for NaN, so a model that returns NaN fails every check
// written with it (a check written as "differs by more than" would pass).
func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

// Unequal shares and demands (where the shortfall's mean term is not zero)
// against the exact expectation over the binomial: with G in the hundreds
// the normal approximation is within 1% of it.
func TestExpectedRemoteUnequalSharesMatchesBinomial(t *testing.T) {
	for _, c := range []struct {
		share  []float64
		demand []int
	}{
		{[]float64{0.6, 0.4}, []int{100, 100}},
		{[]float64{0.2, 0.3, 0.5}, []int{96, 96, 96}},
		{[]float64{0.25, 0.25, 0.5}, []int{64, 128, 64}},
		{[]float64{0.7, 0.3}, []int{300, 100}},
		// Demand within a deviation or two of the mean: both terms count.
		{[]float64{0.55, 0.45}, []int{100, 100}},
		{[]float64{0.26, 0.24, 0.25, 0.25}, []int{64, 64, 64, 64}},
	} {
		g := 0
		for _, d := range c.demand {
			g += d
		}
		exact := 0.0
		for i, p := range c.share {
			exact += expectedShortfall(g, p, c.demand[i])
		}
		exact /= float64(g)
		got := ExpectedRemote(c.share, c.demand)
		t.Logf("shares %v demands %v: model %.6f, exact %.6f", c.share, c.demand, got, exact)
		if !near(got, exact, 0.01*exact) {
			t.Errorf("shares %v demands %v: model %.4f, exact binomial %.4f", c.share, c.demand, got, exact)
		}
	}
}

// expectedShortfall is E[max(0, d − X)] for X ~ Binomial(g, p), summed
// exactly (log-space terms, so large g does not overflow).
func expectedShortfall(g int, p float64, d int) float64 {
	sum := 0.0
	lg, _ := math.Lgamma(float64(g + 1))
	for x := 0; x < d && x <= g; x++ {
		lx, _ := math.Lgamma(float64(x + 1))
		lr, _ := math.Lgamma(float64(g - x + 1))
		logP := lg - lx - lr + float64(x)*math.Log(p) + float64(g-x)*math.Log1p(-p)
		sum += float64(d-x) * math.Exp(logP)
	}
	return sum
}

func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb53fe62d1a85
	return x ^ x>>33
}
