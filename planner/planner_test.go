package planner

import (
	"math"
	"testing"
)

const MiB = 1 << 20

func near(a, b float64) bool { return math.Abs(a-b) <= 1e-6*math.Max(1, math.Abs(b)) }

// manyBatches makes the pipeline's one-batch term negligible, so that the
// figures below can be checked by hand; TestPipelineTerm covers it.
const manyBatches = 1e12

// A synthetic report set like the split bench's: two datasets of 72 MiB on
// storage read at 10 MiB/s, 96 MiB of memory, equal split so far (48 MiB
// each, so 24 MiB of each read from storage per epoch). "io" computes
// nothing; "gpu" computes 4 s an epoch.
func benchLike() Input {
	ds := map[string]Dataset{
		"a": {Name: "a", Bytes: 72 * MiB, StorageBps: 10 * MiB, Cached: 48 * MiB, Current: 48 * MiB},
		"b": {Name: "b", Bytes: 72 * MiB, StorageBps: 10 * MiB, Cached: 48 * MiB, Current: 48 * MiB},
	}
	jobs := []Job{
		// 24 MiB at 10 MiB/s = 2.4 s, plus 0.6 s fetching hits (1000 items).
		{Name: "io", Dataset: "a", Ranks: 1, EpochS: 3.0, StepS: 0.01, Items: 1000, Batches: manyBatches, MissBytes: 24 * MiB},
		// Compute 4 s; fetching (2.4 s + hits) hides under it; 0.1 s of waits.
		{Name: "gpu", Dataset: "b", Ranks: 1, EpochS: 4.1, StepS: 4.0, Items: 1000, Batches: manyBatches, MissBytes: 24 * MiB},
	}
	return Input{Memory: 96 * MiB, Jobs: jobs, Datasets: ds, Margin: 0.1}
}

func TestModelFitsTheMeasuredEpoch(t *testing.T) {
	in := benchLike()
	hit := HitCost(in.Jobs, in.Datasets)
	if !near(hit, 0.6/1000) {
		t.Fatalf("hit cost %g s/item; want 0.6 ms from the fetch-bound job", hit)
	}
	for _, j := range in.Jobs {
		d := in.Datasets[j.Dataset]
		m := Fit(j, d, hit)
		if got := m.Epoch(d.Bytes - j.MissBytes); !near(got, j.EpochS) {
			t.Errorf("%s: the model predicts %g s at the measured point; measured %g", j.Name, got, j.EpochS)
		}
	}
	io := Fit(in.Jobs[0], in.Datasets["a"], hit)
	if !near(io.Epoch(72*MiB), 0.6) || !near(io.Epoch(0), 0.6+7.2) {
		t.Fatalf("io: %g s fully cached, %g s cold; want 0.6 and 7.8", io.Epoch(72*MiB), io.Epoch(0))
	}
	if io.Knee(0.1) != 72*MiB {
		t.Fatalf("io's knee %g; a job that computes nothing gains until all is cached", io.Knee(0.1))
	}
	gpu := Fit(in.Jobs[1], in.Datasets["b"], hit)
	// Fetching must fit in 0.9 × 4 s: 0.6 s of hits + (72 MiB − c)/10 MiB/s
	// ≤ 3.6 s, so c ≥ 42 MiB.
	if !near(gpu.Knee(0.1), 42*MiB) {
		t.Fatalf("gpu's knee %g MiB; want 42", gpu.Knee(0.1)/MiB)
	}
	if !near(gpu.Epoch(42*MiB), 4.1) || !(gpu.Epoch(20*MiB) > 4.1) {
		t.Fatalf("gpu: %g s at its knee (want the measured 4.1), %g s well below it (want more)", gpu.Epoch(42*MiB), gpu.Epoch(20*MiB))
	}
}

func TestSplitGivesTheSensitiveJobTheMemory(t *testing.T) {
	in := benchLike()
	p := Split(in)
	if len(p.Jobs) != 2 || len(p.Split) != 2 {
		t.Fatalf("plan %+v", p)
	}
	if !near(p.Split["b"], 42*MiB) || !near(p.Split["a"], 54*MiB) {
		t.Fatalf("split a=%g b=%g MiB; want gpu's dataset at its knee (42) and the rest (54) to io's", p.Split["a"]/MiB, p.Split["b"]/MiB)
	}
	if sum := p.Split["a"] + p.Split["b"]; sum > in.Memory {
		t.Fatalf("split %g bytes of %g", sum, in.Memory)
	}
	io, gpu := p.Jobs[0], p.Jobs[1]
	if io.Job != "io" || io.Dataset != "a" || io.EpochS != 3.0 || io.CachedBytes != 48*MiB || io.KneeBytes != 72*MiB {
		t.Fatalf("io row %+v", io)
	}
	if !near(io.EpochSPredicted, 0.6+1.8) {
		t.Fatalf("io predicted %g s under the plan; want 2.4 (18 MiB from storage)", io.EpochSPredicted)
	}
	// One more GiB would save all of io's 24 MiB of storage reads at most,
	// the unit being smaller than that: 10 MiB/s → 102.4 s per GiB.
	if !near(io.SecondsSavedPerGiB, GiB/(10.0*MiB)) {
		t.Fatalf("io saves %g s/GiB; want %g", io.SecondsSavedPerGiB, GiB/(10.0*MiB))
	}
	if math.Abs(gpu.KneeBytes-42*MiB) > 1 || !near(gpu.EpochSPredicted, 4.1) || gpu.SecondsSavedPerGiB > 1e-6 {
		t.Fatalf("gpu row %+v; want knee 42 MiB, 4.1 s predicted, nothing saved by more cache", gpu)
	}
	if !near(p.Saving, 1-(2.4+4.1)/(3.0+4.1)) {
		t.Fatalf("saving %g", p.Saving)
	}
}

// The floor: a job whose knee lies beyond its proportional share keeps the
// proportional share even when another saves more per GiB, so no job is
// predicted slower than under the equal split.
func TestFloorKeepsTheProportionalShare(t *testing.T) {
	in := benchLike()
	// a's storage is far slower: every byte of it saves 5x the seconds.
	d := in.Datasets["a"]
	d.StorageBps = 2 * MiB
	in.Datasets["a"] = d
	in.Jobs[0].EpochS = 12.6 // 24 MiB at 2 MiB/s + 0.6 s
	// gpu computes 8 s: its knee (0.6 + (72 − c)/10 ≤ 7.2 → c ≥ 6 MiB) is
	// below its share; make it compute 1 s so the knee (≥ 69 MiB) is above.
	in.Jobs[1].StepS, in.Jobs[1].EpochS = 1.0, 3.0
	p := Split(in)
	gpu := Fit(in.Jobs[1], in.Datasets["b"], HitCost(in.Jobs, in.Datasets))
	if gpu.Knee(0.1) <= 48*MiB {
		t.Fatalf("setup: gpu's knee %g MiB should exceed its 48 MiB share", gpu.Knee(0.1)/MiB)
	}
	if !near(p.Split["b"], 48*MiB) || !near(p.Split["a"], 48*MiB) {
		t.Fatalf("split a=%g b=%g MiB; want b held at its proportional 48 MiB", p.Split["a"]/MiB, p.Split["b"]/MiB)
	}
	for _, j := range p.Jobs {
		if j.EpochSPredicted > j.EpochSNow+1e-9 {
			t.Errorf("%s predicted %g s under the plan, %g under the equal split", j.Job, j.EpochSPredicted, j.EpochSNow)
		}
	}
	// With three jobs and ranks 2:1:1, the shares are 1/2, 1/4, 1/4.
	in = benchLike()
	in.Datasets["c"] = Dataset{Name: "c", Bytes: 200 * MiB, StorageBps: 1 * MiB, Cached: 0, Current: 0}
	in.Jobs[1].Ranks = 2
	in.Jobs[1].StepS, in.Jobs[1].EpochS = 100, 100 // knee 0: compute hides everything
	in.Jobs = append(in.Jobs, Job{Name: "slow", Dataset: "c", Ranks: 1, EpochS: 200, StepS: 0, Items: 10, Batches: manyBatches, MissBytes: 200 * MiB})
	p = Split(in)
	if p.Split["b"] != 0 {
		t.Fatalf("a job whose compute hides every read kept %g MiB", p.Split["b"]/MiB)
	}
	if p.Split["a"] < 24*MiB {
		t.Fatalf("io kept %g MiB, below its floor min(24 MiB share, 72 MiB knee)", p.Split["a"]/MiB)
	}
	if sum := p.Split["a"] + p.Split["b"] + p.Split["c"]; sum > in.Memory+1 {
		t.Fatalf("split %g MiB of %g", sum/MiB, in.Memory/MiB)
	}
}

func TestEverythingFitsAndUnknownStorage(t *testing.T) {
	in := benchLike()
	in.Memory = 200 * MiB
	p := Split(in)
	if p.Split["a"] != 72*MiB || p.Split["b"] != 72*MiB {
		t.Fatalf("with room for both: %g and %g MiB; want each whole", p.Split["a"]/MiB, p.Split["b"]/MiB)
	}
	// A dataset whose storage was never read (all cached): its knee is the
	// whole dataset, nothing is taken from it below its share.
	in = benchLike()
	d := in.Datasets["b"]
	d.StorageBps = 0
	in.Datasets["b"] = d
	in.Jobs[1].MissBytes = 0
	m := Fit(in.Jobs[1], d, 0)
	if m.Knee(0.1) != d.Bytes {
		t.Fatalf("unknown storage: knee %g; want the dataset", m.Knee(0.1))
	}
	if p := Split(in); p.Split["b"] < 48*MiB {
		t.Fatalf("unknown storage: kept %g MiB, below its share", p.Split["b"]/MiB)
	}
	// Two jobs on one dataset share it: one entry in the split.
	in = benchLike()
	in.Jobs[1].Dataset = "a"
	delete(in.Datasets, "b")
	p = Split(in)
	if len(p.Split) != 1 || p.Split["a"] != 72*MiB || len(p.Jobs) != 2 {
		t.Fatalf("shared dataset: %+v", p)
	}
	if p := Split(Input{Memory: 1 << 30}); len(p.Jobs) != 0 || len(p.Split) != 0 || p.Saving != 0 {
		t.Fatalf("no jobs: %+v", p)
	}
}

// A two-stage pipeline over N batches takes the longer stage plus one batch
// of the shorter, on either side of the knee; the fit keeps the measured
// epoch; the default margin leaves a quarter of compute free at the knee.
func TestPipelineTerm(t *testing.T) {
	m := Model{C: 4, A: 1, D: 100 * MiB, B: 10 * MiB, N: 8}
	if got := m.Epoch(100 * MiB); !near(got, 4+1.0/8) {
		t.Fatalf("compute-bound: %g; want 4 + 1/8", got)
	}
	if got := m.Epoch(0); !near(got, 11+4.0/8) {
		t.Fatalf("fetch-bound: %g; want 11 + 4/8", got)
	}
	j := Job{Name: "j", Dataset: "d", Ranks: 1, EpochS: 6, StepS: 0.8, Items: 80, Batches: 8, MissBytes: 50 * MiB}
	d := Dataset{Name: "d", Bytes: 100 * MiB, StorageBps: 10 * MiB}
	f := Fit(j, d, 0)
	if !near(f.A, 6-5-0.1) || !near(f.Epoch(50*MiB), 6) {
		t.Fatalf("fit %+v: epoch %g at the measured point", f, f.Epoch(50*MiB))
	}
	if got := (Model{C: 4, A: 1, D: 100 * MiB, B: 10 * MiB}).Knee(DefaultMargin); !near(got, 80*MiB) {
		t.Fatalf("knee %g MiB; want fetching at 3 s of 4: 1 + (100 − c)/10 = 3", got/MiB)
	}
	if p := Split(Input{Memory: 100 * MiB, Jobs: []Job{j}, Datasets: map[string]Dataset{"d": d}}); p.Split["d"] != 100*MiB {
		t.Fatalf("a lone fetch-bound job: %v", p.Split)
	}
}
