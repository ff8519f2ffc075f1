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
			if math.Abs(want-closed) > 1e-9 {
				t.Fatalf("model %.5f, closed form %.5f", want, closed)
			}
			t.Logf("k=%d b=%d: measured %.4f, model %.4f", c.k, c.b, got, want)
			// The normal approximation is coarse for small batches; the
			// per-step shortfalls average over 200 steps.
			if math.Abs(got-want) > 0.25*want+0.005 {
				t.Fatalf("measured remote fraction %.4f, model %.4f", got, want)
			}
		})
	}
	// All owned by one of two nodes with equal demand: half is remote.
	if got := ExpectedRemote([]float64{1, 0}, []int{8, 8}); math.Abs(got-0.5) > 1e-9 {
		t.Fatalf("one node owning everything: %.3f remote, want 0.5", got)
	}
	if !math.IsNaN(ExpectedRemote([]float64{1}, []int{1, 2})) {
		t.Fatal("mismatched shares and demands must give NaN")
	}
}

func mix(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb53fe62d1a85
	return x ^ x>>33
}
