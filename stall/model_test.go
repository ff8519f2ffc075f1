package stall

import (
	"math"
	"testing"
)

func TestModelOverlapsHitsAndMisses(t *testing.T) {
	m := Model{Rates: Rates{Cached: 2000, Cold: 250}, Items: 1000, Bytes: 1 << 30, GPURate: 500}
	cases := []struct{ hit, want float64 }{
		{0, 4},     // every item from storage
		{0.5, 2},   // storage-bound: 500 misses at 250/s
		{0.9, 0.5}, // 100 misses take 0.4 s, serving all 1000 takes 0.5 s
		{1, 0.5},   // memory-bound
	}
	for _, c := range cases {
		if got := m.FetchSeconds(c.hit); math.Abs(got-c.want) > 1e-9 {
			t.Errorf("FetchSeconds(%v) = %v, want %v", c.hit, got, c.want)
		}
	}
	s := m.Predict("minio", 0.5)
	if s.EpochSeconds != 2 || s.StallSeconds != 0 {
		t.Errorf("half cache: %+v, want a 2 s epoch with no stall", s)
	}
	if s := m.Predict("minio", 0); s.StallSeconds != 2 {
		t.Errorf("no cache: stall %v, want 2 s (4 s fetching, 2 s of GPU)", s.StallSeconds)
	}
	// The GPU eats 500/s; storage gives 250/s, so half the dataset must be cached.
	if got := m.MemoryToRemoveStall(); got != 1<<29 {
		t.Errorf("MemoryToRemoveStall = %d, want %d", got, 1<<29)
	}
	if s := m.Predict("minio", float64(m.MemoryToRemoveStall())/float64(m.Bytes)); s.StallSeconds > 1e-9 {
		t.Errorf("stall %v at the memory said to remove it", s.StallSeconds)
	}
	m.GPURate = 4000 // faster than memory: no cache size helps
	if got := m.MemoryToRemoveStall(); got != -1 {
		t.Errorf("MemoryToRemoveStall with a GPU faster than memory = %d, want -1", got)
	}
}
