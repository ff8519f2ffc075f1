package locality

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"stallfree/catalog"
	"stallfree/partition"
	"stallfree/source"
)

func fileDataset(n int) *catalog.Dataset {
	entries := make([]source.Entry, n)
	for i := range entries {
		entries[i] = source.Entry{Key: fmt.Sprintf("img/%05d.jpg", i), Size: 100}
	}
	return &catalog.Dataset{ID: 1, Name: "ds", Version: 1, Manifest: catalog.NewManifest(entries)}
}

// tarDataset has shards of 4 samples, each sample 2 or 3 members.
func tarDataset(shards int) *catalog.Dataset {
	var entries []source.Entry
	for s := range shards {
		shard := fmt.Sprintf("shards/%03d.tar", s)
		off := int64(512)
		for smp := range 4 {
			exts := []string{"jpg", "cls"}
			if smp%2 == 1 {
				exts = append(exts, "json")
			}
			for _, ext := range exts {
				entries = append(entries, source.Entry{Key: fmt.Sprintf("%s/s%03d_%d.%s", shard, s, smp, ext), Size: 10,
					Shard: shard, ShardSize: 1 << 20, Offset: off, Tag: 1})
				off += 1024
			}
		}
	}
	return &catalog.Dataset{ID: 2, Name: "tars", Version: 1, Manifest: catalog.NewManifest(entries)}
}

var threeNodes = []string{"n0", "n1", "n2"}

// checkSteps checks Step against the plan: every item of a unit at position
// x of a rank's order is used in global minibatch x/batch, and every other
// item is marked dropped.
func checkSteps(t *testing.T, ep *EpochPlan) {
	t.Helper()
	want := make([]int32, ep.Data.Manifest.Len())
	for i := range want {
		want[i] = -1
	}
	for _, order := range ep.Ranks {
		for x, u := range order {
			first, end := int(u), int(u)+1
			if ep.Data.Manifest.IsTar() {
				first, end = ep.Data.Manifest.Sample(int(u))
			}
			for i := first; i < end; i++ {
				want[i] = int32(x / ep.BatchSize)
			}
		}
	}
	if !slices.Equal(ep.Step, want) {
		t.Fatalf("steps %v, want %v", ep.Step, want)
	}
}

// remoteByHand counts the units of rank r's order from position whose owner
// on a ring of members is not node.
func remoteByHand(t *testing.T, ep *EpochPlan, members []string, r, position int, node string) int {
	t.Helper()
	ring, err := partition.New(members)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, u := range ep.Ranks[r][min(position, len(ep.Ranks[r])):] {
		if ring.Owner(ep.Data.Name, ep.Data.Manifest.Key(int(u))) != node {
			n++
		}
	}
	return n
}

// A file dataset's epoch: the steps, the dropped tail, what is remote from
// any position (past the end: nothing), and a job without nodes, whose
// every unit is remote.
func TestPlanEpochFiles(t *testing.T) {
	d := fileDataset(103)
	j := &catalog.Job{Name: "j", Dataset: "ds", Seed: 9, WorldSize: 3, BatchSize: 4, Ranks: threeNodes}
	ep, err := PlanEpoch(j, d, 2, threeNodes)
	if err != nil {
		t.Fatal(err)
	}
	checkSteps(t, ep)
	if dropped := slices.Index(ep.Step, -1); dropped < 0 || slices.Index(ep.Step[dropped+1:], -1) >= 0 {
		t.Fatalf("steps %v: want exactly one item dropped (103 = 3·34 + 1)", ep.Step)
	}
	if got := ep.Batches(); got != 9 { // 34 per rank in batches of 4
		t.Fatalf("%d batches, want 9", got)
	}
	for r, node := range threeNodes {
		for _, pos := range []int{0, 1, 17, 34, 40} {
			if got, want := ep.RemoteFrom(r, pos), remoteByHand(t, ep, threeNodes, r, pos, node); got != want {
				t.Fatalf("rank %d from %d: %d remote, counted %d", r, pos, got, want)
			}
		}
		if !slices.Equal(ep.BatchItems(r, 1), ep.Batch(r, 1)) {
			t.Fatalf("rank %d: a file dataset's batch items %v are not its batch %v", r, ep.BatchItems(r, 1), ep.Batch(r, 1))
		}
	}
	if ep.RemoteFrom(0, 0) == 34 {
		t.Fatal("rank 0 has nothing of its own: the ring is not what the plan used")
	}
	anywhere := &catalog.Job{Name: "j", Dataset: "ds", Seed: 9, WorldSize: 3, BatchSize: 4}
	ep, err = PlanEpoch(anywhere, d, 2, threeNodes)
	if err != nil {
		t.Fatal(err)
	}
	if got := ep.RemoteFrom(1, 4); got != 30 {
		t.Fatalf("a rank on no node: %d of 30 units remote", got)
	}
	if got := ep.RemoteFrom(0, 0); got != 34 {
		t.Fatalf("rank 0 on no node: %d of 34 units remote", got)
	}
}

// A tar dataset is planned by sample: each sample's members share its step,
// a batch's items are its samples' members in order, and a sample lives
// with the owner of its key.
func TestPlanEpochTarSamples(t *testing.T) {
	d := tarDataset(6) // 24 samples, 60 members
	m := d.Manifest
	if m.Samples() != 24 {
		t.Fatalf("%d samples, want 24", m.Samples())
	}
	j := &catalog.Job{Name: "j", Dataset: "tars", Seed: 1, WorldSize: 2, BatchSize: 3, Ranks: threeNodes[:2]}
	ep, err := PlanEpoch(j, d, 0, threeNodes)
	if err != nil {
		t.Fatal(err)
	}
	if len(ep.Ranks[0]) != 12 || len(ep.Ranks[1]) != 12 {
		t.Fatalf("rank orders of %d and %d samples, want 12 each", len(ep.Ranks[0]), len(ep.Ranks[1]))
	}
	checkSteps(t, ep)
	if slices.Contains(ep.Step, -1) {
		t.Fatalf("steps %v: nothing is dropped from 24 samples over 2 ranks", ep.Step)
	}
	for r := range 2 {
		var want []int32
		for _, s := range ep.Batch(r, 2) {
			first, end := m.Sample(int(s))
			for i := first; i < end; i++ {
				want = append(want, int32(i))
			}
		}
		if got := ep.BatchItems(r, 2); !slices.Equal(got, want) || len(got) <= 3 {
			t.Fatalf("rank %d batch 2: items %v, want the members %v", r, got, want)
		}
	}
	ring, _ := partition.New(threeNodes)
	for r, node := range threeNodes[:2] {
		want := 0
		for _, s := range ep.Ranks[r] {
			if ring.Owner(d.Name, m.SampleKey(int(s))) != node {
				want++
			}
		}
		if got := ep.RemoteFrom(r, 0); got != want {
			t.Fatalf("rank %d: %d samples remote, counted %d by sample key", r, got, want)
		}
	}
}

// A resumed epoch takes what every rank had left, from position on, and
// splits it afresh: each remaining unit once (but a tail shorter than the
// new world), equal lengths; a position
// outside the epoch is refused, its two ends are not.
func TestResumeEpoch(t *testing.T) {
	d := fileDataset(120)
	prevJob := &catalog.Job{Name: "j", Dataset: "ds", Seed: 4, WorldSize: 4, BatchSize: 5}
	prev, err := PlanEpoch(prevJob, d, 1, threeNodes)
	if err != nil {
		t.Fatal(err)
	}
	j := &catalog.Job{Name: "j", Dataset: "ds", Seed: 4, WorldSize: 3, BatchSize: 5, Ranks: threeNodes}
	for _, pos := range []int{0, 10, 30} {
		ep, err := ResumeEpoch(prev, pos, j, threeNodes)
		if err != nil {
			t.Fatalf("position %d: %v", pos, err)
		}
		// What was left, global step by global step; the tail that does not
		// fill a step of the new world is dropped.
		var rest, got []int32
		for s := pos; s < len(prev.Ranks[0]); s++ {
			for _, o := range prev.Ranks {
				rest = append(rest, o[s])
			}
		}
		rest = rest[:len(rest)-len(rest)%3]
		for _, o := range ep.Ranks {
			if len(o) != len(rest)/3 {
				t.Fatalf("position %d: a rank of %d units, want %d", pos, len(o), len(rest)/3)
			}
			got = append(got, o...)
		}
		slices.Sort(rest)
		slices.Sort(got)
		if !slices.Equal(got, rest) {
			t.Fatalf("position %d: resumed units %v, want what was left %v", pos, got, rest)
		}
		checkSteps(t, ep)
	}
	for _, pos := range []int{-1, 31} {
		if _, err := ResumeEpoch(prev, pos, j, threeNodes); !errors.Is(err, ErrInvalidJob) {
			t.Fatalf("position %d of 30: %v, want ErrInvalidJob", pos, err)
		}
	}
	// The smallest layout resumes; an empty one is refused.
	one := &catalog.Job{Name: "j", Dataset: "ds", Seed: 4, WorldSize: 1, BatchSize: 1, Ranks: threeNodes[:1]}
	if ep, err := ResumeEpoch(prev, 10, one, threeNodes); err != nil || len(ep.Ranks[0]) != 4*20 {
		t.Fatalf("resumed at world 1, batch 1: %v", err)
	}
	for _, bad := range []catalog.Job{{WorldSize: 0, BatchSize: 5}, {WorldSize: 3, BatchSize: 0}} {
		if _, err := ResumeEpoch(prev, 10, &bad, threeNodes); !errors.Is(err, ErrInvalidJob) {
			t.Fatalf("resumed at world %d, batch %d: %v, want ErrInvalidJob", bad.WorldSize, bad.BatchSize, err)
		}
	}
	bad := &catalog.Job{Name: "j", Dataset: "ds", Seed: 4, WorldSize: 2, BatchSize: 5, Ranks: threeNodes}
	if _, err := PlanEpoch(bad, d, 0, threeNodes); !errors.Is(err, ErrInvalidJob) {
		t.Fatalf("3 rank nodes for a world of 2: %v, want ErrInvalidJob", err)
	}
}

// Batches rounds up: a partial last minibatch counts, an exact fit adds none.
func TestBatchesRoundUp(t *testing.T) {
	for _, c := range []struct{ n, batch, want int }{{10, 4, 3}, {8, 4, 2}, {1, 4, 1}, {0, 4, 0}} {
		p := &Plan{BatchSize: c.batch, Ranks: [][]int32{make([]int32, c.n)}}
		if got := p.Batches(); got != c.want {
			t.Fatalf("%d units in batches of %d: %d batches, want %d", c.n, c.batch, got, c.want)
		}
	}
	if got := (&Plan{BatchSize: 4}).Batches(); got != 0 {
		t.Fatalf("no ranks: %d batches", got)
	}
}

// The case, over seeds 1..20: a job of world 2 (ranks on n0, n1) over
// 1,200 items on three nodes, batch 16, interrupted after 10 minibatches and
// resumed at world 3 (one rank per node). What is left is re-split with at
// most 10% of it remote, and never more than 1.25 times what the traffic
// model predicts for a plain epoch of the same world and global batch (the
// figure a fresh epoch would give; regrouping by owner keeps the remainder
// well under it).
func TestResumeEpochKeepsLocality(t *testing.T) {
	d := fileDataset(1200)
	ring, err := partition.New(threeNodes)
	if err != nil {
		t.Fatal(err)
	}
	owned := map[string]int{}
	for i := range 1200 {
		owned[ring.Owner(d.Name, d.Manifest.Key(i))]++
	}
	share := make([]float64, len(threeNodes))
	for i, node := range threeNodes {
		share[i] = float64(owned[node]) / 1200
	}
	model := ExpectedRemote(share, []int{16, 16, 16})
	worst := 0.0
	for seed := uint64(1); seed <= 20; seed++ {
		prevJob := &catalog.Job{Name: "j", Dataset: "ds", Seed: seed, WorldSize: 2, BatchSize: 16, Ranks: threeNodes[:2]}
		prev, err := PlanEpoch(prevJob, d, 0, threeNodes)
		if err != nil {
			t.Fatal(err)
		}
		j := &catalog.Job{Name: "j", Dataset: "ds", Seed: seed, WorldSize: 3, BatchSize: 16, Ranks: threeNodes}
		ep, err := ResumeEpoch(prev, 10*16, j, threeNodes)
		if err != nil {
			t.Fatal(err)
		}
		remote, total := 0, 0
		for r := range ep.Ranks {
			remote += remoteByHand(t, ep, threeNodes, r, 0, threeNodes[r])
			total += len(ep.Ranks[r])
		}
		if total != (1200-2*160)/3*3 {
			t.Fatalf("seed %d: %d units resumed, want %d", seed, total, (1200-2*160)/3*3)
		}
		fr := float64(remote) / float64(total)
		worst = max(worst, fr)
		// The bound is 10% and 1.25 x the model; regrouping by owner
		// does better, and this holds it to that (half the model): a
		// regrouping that lost its per-node demand would fall back to about
		// the model's figure.
		if fr > 0.10 || fr > 0.5*model {
			t.Fatalf("seed %d: %.1f%% of the resumed remainder is remote; want at most 10%% and half the model's %.1f%%", seed, 100*fr, 100*model)
		}
	}
	t.Logf("worst of 20 seeds: %.2f%% remote; plain-epoch model %.2f%%", 100*worst, 100*model)
}

// byOwner's order, exactly, on a case where the fill's choice matters: a
// and b run ranks taking 2 units a step each, c runs none. Step 0: a has
// only one unit, b gives two, and the fill comes from c (3 to spare against
// b's 4-2 = 2). Step 1: b gives two; the fill ties b and c at 2 to spare and
// takes the first owner seen (b), then c. The partial last step keeps the
// rest in owner order.
func TestByOwnerOrder(t *testing.T) {
	names := map[int32]string{}
	var units []int32
	for i, o := range []string{"a", "b", "b", "c", "b", "c", "b", "c", "b", "b"} {
		names[int32(i)] = o
		units = append(units, int32(i))
	}
	got := byOwner(units, 4, map[string]int{"a": 2, "b": 2}, func(u int32) string { return names[u] })
	if want := []int32{0, 1, 2, 3, 4, 6, 8, 5, 9, 7}; !slices.Equal(got, want) {
		t.Fatalf("byOwner: %v, want %v", got, want)
	}
}

// byOwner keeps every unit once and gives each node as many of its own
// units per step as its ranks take while it has them; the fill comes from the
// owner with the most to spare.
func TestByOwner(t *testing.T) {
	owner := func(u int32) string { return []string{"a", "b", "c"}[u%3] }
	// 12 units of a, 6 of b, 6 of c (c runs no rank): steps of 8.
	var units []int32
	for i := range int32(24) {
		units = append(units, i*3)
		if i < 6 {
			units = append(units, i*3+1, i*3+2)
		}
	}
	units = units[:24]
	got := byOwner(units, 8, map[string]int{"a": 4, "b": 4}, owner)
	sorted := slices.Clone(got)
	slices.Sort(sorted)
	want := slices.Clone(units)
	slices.Sort(want)
	if !slices.Equal(sorted, want) {
		t.Fatalf("byOwner changed the units: %v, want a permutation of %v", got, units)
	}
	for step := range 3 {
		count := map[string]int{}
		for _, u := range got[step*8 : step*8+8] {
			count[owner(u)]++
		}
		if count["a"] < 4 || count["b"] < min(4, 6-4*step) {
			t.Fatalf("step %d holds %v: a node with units left got fewer than its ranks take", step, count)
		}
	}
}

// Shape is what every epoch plan has, so a rank or batch can be refused
// before an epoch is planned or pinned.
func TestShapeIsThePlans(t *testing.T) {
	for _, d := range []*catalog.Dataset{fileDataset(10), fileDataset(97), fileDataset(3), tarDataset(5)} {
		for _, world := range []int{1, 2, 3, 4} {
			for _, batch := range []int{1, 2, 5, 64} {
				j := &catalog.Job{Name: "j", Dataset: d.Name, Seed: 3, WorldSize: world, BatchSize: batch}
				ep, err := PlanEpoch(j, d, 1, threeNodes)
				if err != nil {
					t.Fatal(err)
				}
				if ranks, batches := Shape(j, d); ranks != len(ep.Ranks) || batches != ep.Batches() {
					t.Errorf("%s, world %d, batch %d: shape %d ranks × %d batches; the plan has %d × %d",
						d.Name, world, batch, ranks, batches, len(ep.Ranks), ep.Batches())
				}
			}
		}
	}
	if r, b := Shape(&catalog.Job{WorldSize: 0, BatchSize: 1}, fileDataset(4)); r != 0 || b != 0 {
		t.Errorf("a job without ranks: %d × %d", r, b)
	}
}
