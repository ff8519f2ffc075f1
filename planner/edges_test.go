package planner

import (
	"math"
	"testing"
)

// The model's pieces at their edges, each against figures worked by hand.
func TestModelEdges(t *testing.T) {
	m := Model{C: 10, N: 2}
	for e, want := range map[float64]float64{12: 4, 5: 0, 16: 11} {
		// e = 12: compute-bound, C + F/N = e gives F = 4; e = 5: less than
		// compute, no fetch fits; e = 16: fetch-bound, F + C/N = e.
		if got := m.maxFetch(e); !near(got, want) {
			t.Errorf("maxFetch(%v) = %v; want %v", e, got, want)
		}
	}
	// Unknown storage: fetching is the hits only, never infinite.
	u := Model{C: 1, A: 2, D: 100}
	if got := u.fetch(0); got != 2 {
		t.Errorf("fetch with no storage rate: %v", got)
	}
	// A job waiting exactly as long as it computes is not fetch-bound.
	if fetchBound(Job{EpochS: 20, StepS: 10}) || !fetchBound(Job{EpochS: 20.5, StepS: 10}) || fetchBound(Job{}) {
		t.Error("fetchBound's edge")
	}
	// Fit with no storage rate yet: what the epoch had beyond compute is
	// all fetching (none of it storage), whatever was missed.
	f := Fit(Job{EpochS: 30, StepS: 10, Batches: 1, MissBytes: 1 << 20}, Dataset{Bytes: 1 << 30}, 0)
	if !near(f.A, 20) {
		t.Errorf("A = %v; want 20", f.A)
	}
}

// HitCost counts only fetch-bound jobs with a storage rate and items:
// (epoch − storage time − one step) per item.
func TestHitCostByHand(t *testing.T) {
	ds := map[string]Dataset{"d": {StorageBps: 10}, "slow": {}}
	jobs := []Job{
		{Dataset: "d", EpochS: 100, StepS: 20, Batches: 4, Items: 10, MissBytes: 100}, // (100 − 10 − 5) / 10
		{Dataset: "slow", EpochS: 100, StepS: 20, Batches: 4, Items: 10, MissBytes: 100},
		{Dataset: "d", EpochS: 100, StepS: 20, Batches: 4, Items: 0, MissBytes: 100},
	}
	if got := HitCost(jobs, ds); !near(got, 8.5) {
		t.Fatalf("hit cost %v; want 8.5", got)
	}
}

// The floor is shared by ranks; the defaults of Margin and Unit are the
// documented ones; memory past every dataset is left unallocated (no NaN).
func TestSplitFloorsAndDefaults(t *testing.T) {
	ds := map[string]Dataset{"a": {Name: "a", Bytes: 100}, "b": {Name: "b", Bytes: 100}}
	jobs := []Job{{Name: "x", Dataset: "a", Ranks: 1, EpochS: 2, StepS: 1, Batches: 1}, {Name: "y", Dataset: "b", Ranks: 3, EpochS: 2, StepS: 1, Batches: 1}}
	p := Split(Input{Memory: 40, Jobs: jobs, Datasets: ds})
	if p.Split["a"] != 10 || p.Split["b"] != 30 {
		t.Fatalf("split by ranks 1:3 of 40: %v", p.Split)
	}
	p = Split(Input{Memory: 1000, Jobs: jobs, Datasets: ds})
	if p.Split["a"] != 100 || p.Split["b"] != 100 {
		t.Fatalf("more memory than data: %v", p.Split)
	}
	in := benchLike()
	in.Margin, in.Unit = 0, 0
	def := Split(in)
	in.Margin, in.Unit = DefaultMargin, in.Memory/128
	given := Split(in)
	for i := range def.Jobs {
		if def.Jobs[i] != given.Jobs[i] {
			t.Fatalf("defaults %+v; given %+v", def.Jobs[i], given.Jobs[i])
		}
	}
	if def.Split["a"] != given.Split["a"] || def.Split["b"] != given.Split["b"] {
		t.Fatalf("defaults %v; given %v", def.Split, given.Split)
	}
}

// A job's seconds saved per GiB are measured over one unit, or what is left
// of its dataset when that is less; a dataset wholly allowed saves nothing.
func TestSecondsSavedPerGiB(t *testing.T) {
	in := benchLike()
	in.Unit = 8 * MiB
	d := in.Datasets["a"]
	d.Current = d.Bytes - 2*MiB
	in.Datasets["a"] = d
	full := in.Datasets["b"]
	full.Current = full.Bytes
	in.Datasets["b"] = full
	p := Split(in)
	m := Fit(in.Jobs[0], d, HitCost(in.Jobs, in.Datasets))
	want := (m.Epoch(d.Current) - m.Epoch(d.Bytes)) / (2 * MiB) * GiB
	if !near(p.Jobs[0].SecondsSavedPerGiB, want) || want <= 0 {
		t.Fatalf("saved per GiB %v; want %v", p.Jobs[0].SecondsSavedPerGiB, want)
	}
	if p.Jobs[1].SecondsSavedPerGiB != 0 {
		t.Fatalf("a dataset wholly allowed saves %v", p.Jobs[1].SecondsSavedPerGiB)
	}
}

// Units go where they save the most: with two datasets past their floors,
// the greedy gives each unit to the larger saving, ties to the first by
// name; past every knee, what is left goes in proportion to the room below
// each dataset's size.
func TestGreedyAndLeftover(t *testing.T) {
	job := func(name, ds string) Job {
		return Job{Name: name, Dataset: ds, Ranks: 1, EpochS: 3, StepS: 0.01, Items: 1000, Batches: manyBatches, MissBytes: 24 * MiB}
	}
	same := map[string]Dataset{
		"a": {Name: "a", Bytes: 72 * MiB, StorageBps: 10 * MiB},
		"b": {Name: "b", Bytes: 72 * MiB, StorageBps: 10 * MiB},
		"c": {Name: "c", Bytes: 2 * MiB}, // unknown storage: its knee is all of it
	}
	// Floors: c 2 MiB, a and b 10 MiB each of 30; 8 units of 1 MiB left,
	// each saving a and b alike (their fetch time is linear in what is
	// cached): every tie goes to a, the first by name, up to its knee.
	z := Job{Name: "z", Dataset: "c", Ranks: 1, EpochS: 1, StepS: 1, Batches: 1}
	p := Split(Input{Memory: 30 * MiB, Unit: 1 * MiB, Margin: 0.1, Datasets: same, Jobs: []Job{job("x", "a"), job("y", "b"), z}})
	if p.Split["a"] <= p.Split["b"] || p.Split["a"]+p.Split["b"] != 28*MiB || p.Split["c"] != 2*MiB {
		t.Fatalf("ties: %v", p.Split)
	}
	// Unequal: b's storage is half as fast, so each byte cached saves b's
	// job twice a's.
	slowB := map[string]Dataset{"a": same["a"], "b": {Name: "b", Bytes: 72 * MiB, StorageBps: 5 * MiB}, "c": same["c"]}
	p = Split(Input{Memory: 30 * MiB, Unit: 1 * MiB, Margin: 0.1, Datasets: slowB, Jobs: []Job{job("x", "a"), job("y", "b"), z}})
	if p.Split["b"] != 18*MiB || p.Split["a"] != 10*MiB {
		t.Fatalf("the larger saving did not get the units: %v", p.Split)
	}
}

// Past every knee the rest is shared in proportion to the room left below
// each dataset's size.
func TestLeftoverInProportionToRoom(t *testing.T) {
	ds := map[string]Dataset{
		"a": {Name: "a", Bytes: 100 * MiB, StorageBps: 1000 * MiB},
		"b": {Name: "b", Bytes: 300 * MiB, StorageBps: 1000 * MiB},
	}
	// Compute-bound jobs with fast storage: their knees are far below their sizes.
	jobs := []Job{
		{Name: "x", Dataset: "a", Ranks: 1, EpochS: 10, StepS: 10, Items: 1, Batches: manyBatches, MissBytes: 100 * MiB},
		{Name: "y", Dataset: "b", Ranks: 1, EpochS: 10, StepS: 10, Items: 1, Batches: manyBatches, MissBytes: 300 * MiB},
	}
	p := Split(Input{Memory: 200 * MiB, Unit: MiB, Datasets: ds, Jobs: jobs})
	ka, kb := p.Jobs[0].KneeBytes, p.Jobs[1].KneeBytes
	if ka >= 100*MiB || kb >= 300*MiB {
		t.Fatalf("knees %v %v", ka, kb)
	}
	ra, rb := 100*MiB-p.Split["a"], 300*MiB-p.Split["b"]
	// Room left after the leftover is in the same proportion as before it.
	if math.Abs(ra/rb-(100*MiB-ka)/(300*MiB-kb)) > 1e-3 || math.Abs(p.Split["a"]+p.Split["b"]-200*MiB) > 2 {
		t.Fatalf("split %v (knees %v, %v)", p.Split, ka, kb)
	}
}
