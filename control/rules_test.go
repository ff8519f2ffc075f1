package control

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/internal/testutil"
	"stallfree/relay"
	"stallfree/source"
)

// The rules a leader applies before anything reaches raft, each tested on a
// real one-member raft (on disk) that leads: what is refused changes
// nothing, what is accepted is what the catalog then holds.

// openLeaderWith is openLeader with cfg (Name, Logger filled in).
func openLeaderWith(t *testing.T, cfg Config) *Control {
	t.Helper()
	c := openLeader(t)
	cfg.Name, cfg.Logger = "n1", testutil.Discard()
	return New(cfg, c.cat, lone{"n1"})
}

// dataset is a directory of n one-byte files and its normalized spec.
func dataset(t *testing.T, n int) (dir, norm string) {
	t.Helper()
	files := map[string][]byte{}
	for i := range n {
		files[strings.Repeat("x", 1)+string(rune('a'+i%26))+strings.Repeat("0", i/26)] = []byte{byte(i)}
	}
	dir = testutil.WriteTree(t, files)
	norm, err := source.Normalize(dir)
	if err != nil {
		t.Fatal(err)
	}
	return dir, norm
}

var bg = context.Background()

// writeShard writes a WebDataset shard of one sample (s1.jpg, s1.cls) and
// two members a listing leaves out: a directory and a name leading out.
func writeShard(t *testing.T, path string) {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, m := range []struct {
		name string
		typ  byte
	}{{"s1.jpg", tar.TypeReg}, {"s1.cls", tar.TypeReg}, {"dir/", tar.TypeDir}, {"../evil.jpg", tar.TypeReg}} {
		body := []byte("member " + m.name)
		if m.typ == tar.TypeDir {
			body = nil
		}
		if err := tw.WriteHeader(&tar.Header{Name: m.name, Typeflag: m.typ, Mode: 0o644, Size: int64(len(body))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

// --allow-source holds where a source really is: a path outside every
// prefix, or a symlink inside one that leads out, is refused (and the
// message says where it leads); one that leads in is allowed; a prefix that
// does not exist cannot be configured.
func TestAllowSourceFollowsSymlinks(t *testing.T) {
	root := t.TempDir()
	allowed, outside := filepath.Join(root, "allowed"), filepath.Join(root, "outside")
	for _, d := range []string{filepath.Join(allowed, "ds"), outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(outside, filepath.Join(allowed, "out")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(allowed, "ds"), filepath.Join(root, "in")); err != nil {
		t.Fatal(err)
	}
	if _, err := Resolve([]string{filepath.Join(root, "missing")}); err == nil || !strings.Contains(err.Error(), "--allow-source") {
		t.Fatalf("a missing prefix: %v", err)
	}
	prefixes, err := Resolve([]string{allowed})
	if err != nil {
		t.Fatal(err)
	}
	c := openLeaderWith(t, Config{AllowSources: prefixes})

	if norm, err := c.CheckSource(filepath.Join(allowed, "ds")); err != nil || norm != "dir://"+filepath.Join(allowed, "ds") {
		t.Fatalf("inside: %q, %v", norm, err)
	}
	if _, err := c.CheckSource(filepath.Join(root, "in")); err != nil {
		t.Fatalf("a symlink leading in: %v", err)
	}
	if err := c.Allowed("dir://" + allowed); err != nil {
		t.Fatalf("the prefix itself: %v", err)
	}
	_, err = c.CheckSource(outside)
	if !errors.Is(err, ErrForbiddenSource) || strings.Contains(err.Error(), "really") {
		t.Fatalf("outside: %v", err)
	}
	_, err = c.CheckSource(filepath.Join(allowed, "out"))
	if !errors.Is(err, ErrForbiddenSource) || !strings.Contains(err.Error(), "really dir://"+outside) {
		t.Fatalf("a symlink leading out: %v", err)
	}
	if _, err := c.CheckSource("ftp://x"); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("an unknown scheme: %v", err)
	}
	if _, err := c.CheckSource(filepath.Join(allowed, "gone")); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a path that does not exist, under a prefix: %v", err)
	}
	if _, _, err := c.PutDataset(bg, "ds", outside); !errors.Is(err, ErrForbiddenSource) || c.HasDataset("ds") {
		t.Fatalf("PutDataset outside: %v (registered: %v)", err, c.HasDataset("ds"))
	}
	if _, _, err := c.SetQuota(bg, "ds", outside, api.QuotaOf(1)); !errors.Is(err, ErrForbiddenSource) || c.HasDataset("ds") {
		t.Fatalf("SetQuota outside: %v", err)
	}
	// A refused --dataset is marked so that the node stops at start.
	if err := c.RegisterAtStart(bg, []string{"ds=" + outside}); !errors.Is(err, ErrForbiddenSource) || !errors.Is(err, ErrDatasetFlag) || c.HasDataset("ds") {
		t.Fatalf("--dataset outside: %v", err)
	}
	if err := c.RegisterAtStart(bg, []string{"ds=" + filepath.Join(allowed, "gone")}); !errors.Is(err, ErrDatasetFlag) || c.HasDataset("ds") {
		t.Fatalf("--dataset that cannot be listed: %v", err)
	}
	// Without prefixes every source is allowed.
	if err := openLeader(t).Allowed("dir://" + outside); err != nil {
		t.Fatal(err)
	}
}

// A registration lists the source once: the same name and source again is
// the same dataset (not created), another source under the name a
// conflict; a source that cannot be listed registers nothing. Each listing
// is reported while and after it runs.
func TestRegistration(t *testing.T) {
	c := openLeader(t)
	dir, norm := dataset(t, 30)
	if _, ok := c.Registration("ds"); ok {
		t.Fatal("a listing reported before any ran")
	}
	info, created, err := c.PutDataset(bg, "ds", dir)
	if err != nil || !created {
		t.Fatalf("register: created %v, %v", created, err)
	}
	if info.Name != "ds" || info.Source != norm || info.Items != 30 || info.Bytes != 30 || info.Version == 0 || info.ID == 0 {
		t.Fatalf("registered %+v", info)
	}
	r, ok := c.Registration("ds")
	if !ok || r.Running || r.Listed != 30 || r.Error != "" || r.Seconds <= 0 {
		t.Fatalf("registration report %+v (%v)", r, ok)
	}
	again, created, err := c.PutDataset(bg, "ds", "dir://"+dir)
	if err != nil || created || again != info {
		t.Fatalf("again: %+v, created %v, %v", again, created, err)
	}
	other, _ := dataset(t, 2)
	if _, _, err := c.PutDataset(bg, "ds", other); !errors.Is(err, catalog.ErrConflict) || !strings.Contains(err.Error(), norm) {
		t.Fatalf("another source: %v", err)
	}
	if got := c.Datasets(); len(got) != 1 || got[0] != info {
		t.Fatalf("datasets %+v", got)
	}

	gone := filepath.Join(t.TempDir(), "gone")
	if _, _, err = c.PutDataset(bg, "gone", gone); !errors.Is(err, ErrBadRequest) || c.HasDataset("gone") {
		t.Fatalf("a directory that is not there: %v", err)
	}
	if r, ok := c.Registration("gone"); !ok || r.Running || r.Error == "" {
		t.Fatalf("failed listing reported as %+v", r)
	}
	// A tar dataset counts what its shards left out.
	shards := t.TempDir()
	writeShard(t, filepath.Join(shards, "shard-0.tar"))
	tinfo, created, err := c.PutDataset(bg, "tar", "tar+dir://"+shards)
	if err != nil || !created || tinfo.Shards != 1 || tinfo.Items != 2 || tinfo.Samples != 1 || tinfo.LeftOut != 2 {
		t.Fatalf("a tar dataset: %+v, %v", tinfo, err)
	}
}

// What a node keeps of failed listings is bounded: a source longer than a
// path is refused before any listing, a long error is cut, and past
// maxRegistrations names the oldest finished listing is forgotten (the
// attack round held a gigabyte with 300 failed registrations of 1 MiB
// sources, each error kept whole under its own name forever).
func TestFailedRegistrationsAreBounded(t *testing.T) {
	c := openLeader(t)
	if _, _, err := c.PutDataset(bg, "long", "/"+strings.Repeat("a", MaxSourceLen)); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a source past MaxSourceLen: %v", err)
	}
	if _, ok := c.Registration("long"); ok {
		t.Fatal("a source refused before listing left a listing report")
	}
	var segs []string
	for range 12 {
		segs = append(segs, strings.Repeat("d", 250)) // 3 KB: under MaxSourceLen, its error over maxRegErrorLen
	}
	deep := filepath.Join(append([]string{t.TempDir()}, append(segs, "gone")...)...)
	if _, _, err := c.PutDataset(bg, "first", deep); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a missing directory: %v", err)
	}
	r, ok := c.Registration("first")
	if !ok || len(r.Error) != maxRegErrorLen+len("…") || !strings.HasSuffix(r.Error, "…") {
		t.Fatalf("a failed listing's report: %d bytes of error (%v); want it cut at %d", len(r.Error), ok, maxRegErrorLen)
	}
	for i := range maxRegistrations {
		if _, _, err := c.PutDataset(bg, fmt.Sprintf("n%d", i), deep); !errors.Is(err, ErrBadRequest) {
			t.Fatal(err)
		}
	}
	c.mu.Lock()
	kept := len(c.registrations)
	c.mu.Unlock()
	if kept != maxRegistrations {
		t.Fatalf("%d listings kept; want %d", kept, maxRegistrations)
	}
	if _, ok := c.Registration("first"); ok {
		t.Fatal("the oldest listing was kept past the bound")
	}
	if r, ok := c.Registration(fmt.Sprintf("n%d", maxRegistrations-1)); !ok || r.Error == "" {
		t.Fatalf("the newest listing: %+v %v", r, ok)
	}
}

// A dataset the leader does not hold is not found at once; one it holds is.
func TestDatasetLookups(t *testing.T) {
	c := openLeader(t)
	start := time.Now()
	if _, err := c.Dataset(bg, "none"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("unknown: %v", err)
	}
	if waited := time.Since(start); waited >= followerGrace {
		t.Fatalf("the leader waited %v for a dataset it does not have", waited)
	}
	dir, _ := dataset(t, 3)
	if _, _, err := c.PutDataset(bg, "ds", dir); err != nil {
		t.Fatal(err)
	}
	if d, err := c.Dataset(bg, "ds"); err != nil || d.Name != "ds" || d.Manifest.Len() != 3 {
		t.Fatalf("known: %v", err)
	}
	if err := c.DeleteDataset(bg, "ds"); err != nil || c.HasDataset("ds") {
		t.Fatalf("delete: %v", err)
	}
	if err := c.DeleteDataset(bg, "ds"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("delete again: %v", err)
	}
}

// --dataset NAME=SOURCE: a malformed flag is refused before anything is
// registered; a good one registers once, and again is no change.
func TestRegisterAtStart(t *testing.T) {
	c := openLeader(t)
	dir, _ := dataset(t, 4)
	for _, bad := range []string{"ds", "=" + dir, "ds="} {
		err := c.RegisterAtStart(bg, []string{bad, "ok=" + dir})
		if err == nil || !strings.Contains(err.Error(), "want NAME=SOURCE") || c.HasDataset("ok") {
			t.Fatalf("%q: %v", bad, err)
		}
	}
	if err := c.RegisterAtStart(bg, []string{"a=" + dir, "b=" + dir}); err != nil {
		t.Fatal(err)
	}
	if err := c.RegisterAtStart(bg, []string{"a=" + dir}); err != nil {
		t.Fatalf("again: %v", err)
	}
	if got := c.Datasets(); len(got) != 2 || got[0].Items != 4 || got[1].Items != 4 {
		t.Fatalf("datasets %+v", got)
	}
	other, _ := dataset(t, 1)
	if err := c.RegisterAtStart(bg, []string{"a=" + other}); !errors.Is(err, catalog.ErrConflict) || !strings.Contains(err.Error(), "--dataset a") {
		t.Fatalf("a conflicting flag: %v", err)
	}
	ctx, cancel := context.WithCancel(bg)
	cancel()
	if err := c.RegisterAtStart(ctx, []string{"c=" + dir}); err == nil || c.HasDataset("c") {
		t.Fatalf("a cancelled start: %v", err)
	}
}

// A quota is set on a dataset, registering it from its source when given;
// without a source the dataset must exist; lifting removes it.
func TestQuotas(t *testing.T) {
	c := openLeader(t)
	dir, _ := dataset(t, 5)
	if _, _, err := c.SetQuota(bg, "ds", "", api.QuotaOf(100)); !errors.Is(err, catalog.ErrNotFound) || !strings.Contains(err.Error(), "give its source") {
		t.Fatalf("quota of an unknown dataset: %v", err)
	}
	info, created, err := c.SetQuota(bg, "ds", dir, api.QuotaOf(100))
	if err != nil || !created || info.Quota == nil || *info.Quota != 100 || info.Items != 5 {
		t.Fatalf("register with a quota: %+v, %v, %v", info, created, err)
	}
	info, created, err = c.SetQuota(bg, "ds", "", api.QuotaOf(7))
	if err != nil || created || info.Quota == nil || *info.Quota != 7 {
		t.Fatalf("change: %+v, %v, %v", info, created, err)
	}
	info, created, err = c.SetQuota(bg, "ds", dir, api.Quota{Given: true, Lift: true})
	if err != nil || created || info.Quota != nil {
		t.Fatalf("lift: %+v, %v, %v", info, created, err)
	}
	other, _ := dataset(t, 1)
	if _, _, err := c.SetQuota(bg, "ds", other, api.QuotaOf(1)); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("a quota with another source: %v", err)
	}
	if d, _ := c.Dataset(bg, "ds"); d.Quota != nil {
		t.Fatalf("a refused quota was set: %d", *d.Quota)
	}
}

// A group defined again the same way is not created again; another spec
// under its name replaces it; a group is ended once.
func TestGroupsOnTheLeader(t *testing.T) {
	c := openLeader(t)
	dir, _ := dataset(t, 10)
	if _, _, err := c.PutDataset(bg, "ds", dir); err != nil {
		t.Fatal(err)
	}
	g := catalog.Group{Name: "g", Dataset: "ds", Seed: 3, BatchSize: 4, Jobs: 2, Window: 2}
	got, created, err := c.PutGroup(bg, g)
	if err != nil || !created || got.Samples != 10 || got.Version == 0 {
		t.Fatalf("define: %+v, %v, %v", got, created, err)
	}
	same, created, err := c.PutGroup(bg, g)
	if err != nil || created || same.Version != got.Version {
		t.Fatalf("again: %+v, %v, %v", same, created, err)
	}
	g.Jobs = 3
	if changed, created, err := c.PutGroup(bg, g); err != nil || !created || changed.Jobs != 3 || changed.Version == got.Version {
		t.Fatalf("redefine: %+v, %v, %v", changed, created, err)
	}
	if _, _, err := c.PutGroup(bg, catalog.Group{Name: "h", Dataset: "none", Seed: 1, BatchSize: 1, Jobs: 1, Window: 1}); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("a group over no dataset: %v", err)
	}
	if err := c.DeleteGroup(bg, "g"); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteGroup(bg, "g"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("ended twice: %v", err)
	}
}

// A derived dataset is shown as such: its parent and stage, no source of
// its own; deriving it again the same way creates nothing.
func TestDerivedDatasets(t *testing.T) {
	c := openLeader(t)
	dir, _ := dataset(t, 6)
	if _, _, err := c.PutDataset(bg, "ds", dir); err != nil {
		t.Fatal(err)
	}
	info, created, err := c.Leader().DeriveDataset(bg, "ds.dec", "ds", "decode")
	if err != nil || !created || info.DerivedFrom != "ds" || info.Stage != "decode" || info.Source != "" || info.Items != 6 || info.Bytes != 0 {
		t.Fatalf("derive: %+v, %v, %v", info, created, err)
	}
	again, created, err := c.Leader().DeriveDataset(bg, "ds.dec", "ds", "decode")
	if err != nil || created || again.ID != info.ID {
		t.Fatalf("again: %+v, %v, %v", again, created, err)
	}
	if _, _, err := c.Leader().DeriveDataset(bg, "x.dec", "none", "decode"); !errors.Is(err, catalog.ErrNotFound) || c.HasDataset("x.dec") {
		t.Fatalf("over no parent: %v", err)
	}
}

// A job's layout is checked where it arrives, its dataset on the leader;
// a replaced job remembers the generation it replaced.
func TestJobs(t *testing.T) {
	c := openLeader(t)
	dir, _ := dataset(t, 8)
	if _, _, err := c.PutDataset(bg, "ds", dir); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutJob(bg, api.Job{Name: "j", Dataset: "ds", WorldSize: 0, BatchSize: 1}); !errors.Is(err, ErrBadRequest) || c.HasJob("j") {
		t.Fatalf("world size 0: %v", err)
	}
	if _, err := c.PutJob(bg, api.Job{Name: "j", Dataset: "none", WorldSize: 1, BatchSize: 1}); !errors.Is(err, catalog.ErrNotFound) || c.HasJob("j") {
		t.Fatalf("no dataset: %v", err)
	}
	first, err := c.PutJob(bg, api.Job{Name: "j", Dataset: "ds", Seed: 5, WorldSize: 1, BatchSize: 2})
	if err != nil || first.Version == 0 || first.Previous != nil || first.Seed != 5 {
		t.Fatalf("register: %+v, %v", first, err)
	}
	second, err := c.PutJob(bg, api.Job{Name: "j", Dataset: "ds", Seed: 5, WorldSize: 2, BatchSize: 2})
	if err != nil || second.Previous == nil || second.Previous.Generation != first.Version || second.Previous.WorldSize != 1 {
		t.Fatalf("replace: %+v, %v", second, err)
	}
	if got, err := c.Job(bg, "j"); err != nil || got.Version != second.Version || got.WorldSize != 2 {
		t.Fatalf("lookup: %+v, %v", got, err)
	}
	if got := c.Jobs(); len(got) != 1 || got[0].Name != "j" {
		t.Fatalf("jobs %+v", got)
	}
	if _, err := c.Job(bg, "none"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("unknown job: %v", err)
	}
	if err := c.DeleteJob(bg, "j"); err != nil || c.HasJob("j") || len(c.Jobs()) != 0 {
		t.Fatalf("delete: %v", err)
	}
}

// withJob is a leader holding dataset ds of n items and job j over it.
func withJob(t *testing.T, n int, j api.Job) *Control {
	t.Helper()
	c := openLeader(t)
	dir, _ := dataset(t, n)
	if _, _, err := c.PutDataset(bg, "ds", dir); err != nil {
		t.Fatal(err)
	}
	j.Name, j.Dataset = "j", "ds"
	if _, err := c.PutJob(bg, j); err != nil {
		t.Fatal(err)
	}
	return c
}

// every is the union of the ranks' orders of an epoch, sorted.
func every(t *testing.T, c *Control, epoch uint64, world int) []int {
	t.Helper()
	var all []int
	for r := range world {
		o, err := c.RankOrder(bg, "j", epoch, r)
		if err != nil {
			t.Fatal(err)
		}
		if o.Epoch != epoch || o.BatchSize != 3 || o.Batches != (len(o.Indices)+2)/3 {
			t.Fatalf("rank %d: %+v", r, o)
		}
		all = append(all, o.Indices...)
	}
	slices.Sort(all)
	return all
}

// An epoch's ranks read every item once, in one pinned order: the first
// read pins the epoch, the next epoch may start, one past it or an epoch
// already over may not, and a prediction pins nothing.
func TestEpochsArePinnedInOrder(t *testing.T) {
	c := withJob(t, 24, api.Job{Seed: 9, WorldSize: 2, BatchSize: 3})
	if _, ok := c.cat.LatestEpoch("j"); ok {
		t.Fatal("an epoch pinned before any read")
	}
	pred, members, err := c.PredictPlan("j", 4)
	if err != nil || !slices.Equal(members, []string{"n1"}) || len(pred.Ranks) != 2 {
		t.Fatalf("prediction: %v, %v", members, err)
	}
	if _, ok := c.cat.LatestEpoch("j"); ok {
		t.Fatal("a prediction pinned its epoch")
	}
	if all := every(t, c, 4, 2); !slices.Equal(all, seq(24)) {
		t.Fatalf("epoch 4 covers %v", all)
	}
	if latest, ok := c.cat.LatestEpoch("j"); !ok || latest != 4 {
		t.Fatalf("latest epoch %d (%v), want 4 (any epoch may be a job's first)", latest, ok)
	}
	o, _ := c.RankOrder(bg, "j", 4, 1)
	if !slices.Equal(o.Indices, intsOf(pred.Ranks[1])) {
		t.Fatal("the pinned order is not the one predicted with the same members")
	}
	p1, _ := c.Plan(bg, "j", 4)
	p2, _ := c.Plan(bg, "j", 4)
	if p1 != p2 {
		t.Fatal("a plan computed twice: the cache did not keep it")
	}
	if _, err := c.RankOrder(bg, "j", 6, 0); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "next to start is 5") {
		t.Fatalf("two epochs ahead: %v", err)
	}
	if _, err := c.RankOrder(bg, "j", 3, 0); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "is over") {
		t.Fatalf("an epoch over: %v", err)
	}
	if ep, err := c.ReadingPlan("j", 5); err != nil || len(ep.Ranks) != 2 { // the leader pins as a first read would
		t.Fatalf("reading plan of the next epoch: %v", err)
	}
	if latest, _ := c.cat.LatestEpoch("j"); latest != 5 {
		t.Fatalf("latest epoch %d, want 5", latest)
	}
	if _, members, err := c.PredictPlan("j", 5); err != nil || !slices.Equal(members, []string{"n1"}) {
		t.Fatalf("prediction of a pinned epoch: %v, %v", members, err)
	}
	for _, r := range []int{-1, 2} {
		if _, err := c.RankOrder(bg, "j", 5, r); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "[0,2)") {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	if _, err := c.RankOrder(bg, "j", MaxEpoch+1, 0); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "out of range") {
		t.Fatalf("epoch past MaxEpoch: %v", err)
	}
	if _, err := c.Plan(bg, "none", 0); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("unknown job: %v", err)
	}
	if _, _, err := c.PredictPlan("none", 0); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("prediction for an unknown job: %v", err)
	}
}

// The first epoch of a job may be MaxEpoch itself.
func TestMaxEpochIsAnEpoch(t *testing.T) {
	c := withJob(t, 6, api.Job{Seed: 1, WorldSize: 1, BatchSize: 3})
	if all := every(t, c, MaxEpoch, 1); !slices.Equal(all, seq(6)) {
		t.Fatalf("epoch MaxEpoch covers %v", all)
	}
}

// A resumed epoch: under the same generation a rank goes on from its
// position; under the generation replaced (a new world size) the rest of
// every old rank is re-split over the new ranks, each sample exactly once,
// equal lengths; the re-split becomes the order the job reads, and is kept.
func TestResumedOrders(t *testing.T) {
	c := withJob(t, 40, api.Job{Seed: 2, WorldSize: 2, BatchSize: 3})
	replanned := 0
	c.cfg.Replanned = func() { replanned++ }
	old, err := c.Plan(bg, "j", 0) // pins epoch 0 under generation 1
	if err != nil {
		t.Fatal(err)
	}
	gen1 := old.Job.Version
	o, err := c.ResumedOrder(bg, "j", 0, 1, gen1, 6)
	if err != nil || !slices.Equal(o.Indices, intsOf(old.Ranks[1][6:])) || o.Remote != old.RemoteFrom(1, 6) {
		t.Fatalf("same generation from 6: %+v, %v", o, err)
	}
	if o, err := c.ResumedOrder(bg, "j", 0, 0, gen1, 0); err != nil || !slices.Equal(o.Indices, intsOf(old.Ranks[0])) || o.Remote != old.Remote[0] {
		t.Fatalf("same generation from the start: %+v, %v", o, err)
	}
	if o, err := c.ResumedOrder(bg, "j", 0, 0, gen1, len(old.Ranks[0])); err != nil || len(o.Indices) != 0 || o.Batches != 0 {
		t.Fatalf("resumed at the end: %+v, %v", o, err)
	}
	for _, pos := range []int{-1, len(old.Ranks[0]) + 1} {
		if _, err := c.ResumedOrder(bg, "j", 0, 0, gen1, pos); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("position %d: %v", pos, err)
		}
	}
	if replanned != 0 || c.ResumedPlans() != 0 {
		t.Fatal("resuming under the same generation re-split something")
	}

	if _, err := c.PutJob(bg, api.Job{Name: "j", Dataset: "ds", Seed: 2, WorldSize: 3, BatchSize: 3}); err != nil {
		t.Fatal(err)
	}
	var rest []int
	for _, r := range old.Ranks {
		rest = append(rest, intsOf(r[6:])...)
	}
	slices.Sort(rest)
	var got []int
	var first []int
	for r := range 3 {
		o, err := c.ResumedOrder(bg, "j", 0, r, gen1, 6)
		if err != nil {
			t.Fatal(err)
		}
		if len(o.Indices) != len(rest)/3 {
			t.Fatalf("rank %d resumes with %d samples, want %d", r, len(o.Indices), len(rest)/3)
		}
		if r == 0 {
			first = o.Indices
		}
		got = append(got, o.Indices...)
	}
	slices.Sort(got)
	if len(rest)%3 == 0 && !slices.Equal(got, rest) {
		t.Fatalf("re-split %v, want the rest %v", got, rest)
	}
	for _, i := range got {
		if _, dup := slices.BinarySearch(rest, i); !dup {
			t.Fatalf("sample %d was not left by any old rank", i)
		}
	}
	if replanned != 1 || c.ResumedPlans() != 1 {
		t.Fatalf("re-split %d times, %d plans kept: want once, 1", replanned, c.ResumedPlans())
	}
	ep, err := c.ReadingPlan("j", 0)
	if err != nil || !slices.Equal(intsOf(ep.Ranks[0]), first) {
		t.Fatalf("the job reads epoch 0 in the re-split order: %v", err)
	}
	if ep, err := c.ReadingPlan("j", 1); err != nil || slices.Equal(intsOf(ep.Ranks[0]), first) {
		t.Fatalf("the next epoch read in the re-split order: %v", err)
	}

	if _, err := c.ResumedOrder(bg, "j", 0, 0, gen1+1000, 6); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("an unknown generation: %v", err)
	}
	if _, err := c.ResumedOrder(bg, "j", 1, 0, gen1, 0); !errors.Is(err, catalog.ErrConflict) || !strings.Contains(err.Error(), "never started") {
		t.Fatalf("an epoch never started under generation 1: %v", err)
	}
	if _, err := c.ResumedOrder(bg, "j", 0, 3, gen1, 6); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("rank 3 of 3: %v", err)
	}
	// Each position is a plan of its own, kept until there are MaxPlans.
	for pos := range 5 {
		if _, err := c.ResumedOrder(bg, "j", 0, 0, gen1, pos); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.ResumedPlans(); n != 6 {
		t.Fatalf("%d re-split plans kept after six positions, want 6", n)
	}
	// Many positions: the plans kept stay bounded.
	for pos := range MaxPlans + 1 {
		if _, err := c.ResumedOrder(bg, "j", 0, 0, gen1, pos); err != nil {
			t.Fatal(err)
		}
	}
	if n := c.ResumedPlans(); n < 1 || n > MaxPlans {
		t.Fatalf("%d re-split plans kept, bound %d", n, MaxPlans)
	}
}

// Positions are kept by rank, the latest per rank, listed in rank order,
// bounded by the job's world size; out-of-range reports are refused.
func TestPositions(t *testing.T) {
	c := withJob(t, 4, api.Job{Seed: 1, WorldSize: 2, BatchSize: 3})
	if err := c.ReportPosition("none", api.RankPosition{}); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("unknown job: %v", err)
	}
	for _, p := range []api.RankPosition{{Rank: api.MaxWorldSize}, {Epoch: MaxEpoch + 1}} {
		if err := c.ReportPosition("j", p); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("%+v: %v", p, err)
		}
	}
	if got := c.RankPositions("j"); len(got) != 0 {
		t.Fatalf("refused reports kept: %+v", got)
	}
	for _, r := range []int{2, 0, 1, 0} {
		if err := c.ReportPosition("j", api.RankPosition{Rank: r, Epoch: uint64(r), Position: 10 * r}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.ReportPosition("j", api.RankPosition{Rank: api.MaxWorldSize - 1, Epoch: MaxEpoch}); err != nil {
		t.Fatalf("the last rank at the last epoch: %v", err)
	}
	got := c.RankPositions("j")
	if len(got) != 4 || got[0].Rank != 0 || got[1].Rank != 1 || got[2].Rank != 2 || got[2].Position != 20 || got[3].Rank != api.MaxWorldSize-1 {
		t.Fatalf("positions %+v", got)
	}
	if got[0].SecondsAgo < 0 || got[0].SecondsAgo > 60 {
		t.Fatalf("seconds ago %v", got[0].SecondsAgo)
	}
	// World size 2: at most 4×2+64 ranks are kept, and one more report
	// past that starts them over (ranks 0, 1, 2 and the last are kept).
	for r := 3; r < 72; r++ {
		if err := c.ReportPosition("j", api.RankPosition{Rank: r}); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(c.RankPositions("j")); n != 73 {
		t.Fatalf("%d ranks kept, want 73 (72 and the one past)", n)
	}
	if err := c.ReportPosition("j", api.RankPosition{Rank: 100}); err != nil {
		t.Fatal(err)
	}
	if got := c.RankPositions("j"); len(got) != 1 || got[0].Rank != 100 {
		t.Fatalf("past the bound: %+v", got)
	}
	// A deleted job's positions go once the node forgets gone jobs (its
	// catalog watcher does, on every change); a live job's stay.
	c.ForgetGoneJobs()
	if got := c.RankPositions("j"); len(got) != 1 {
		t.Fatalf("a live job's positions after ForgetGoneJobs: %+v", got)
	}
	if err := c.DeleteJob(bg, "j"); err != nil {
		t.Fatal(err)
	}
	c.ForgetGoneJobs()
	c.mu.Lock()
	kept := len(c.positions)
	c.mu.Unlock()
	if kept != 0 {
		t.Fatalf("positions of %d deleted jobs kept", kept)
	}
}

// A leader's catalog is ready once it has applied its own log.
func TestLeaderCatchesUpOnItsOwn(t *testing.T) {
	c := openLeader(t)
	ctx, cancel := context.WithCancel(bg)
	defer cancel()
	go c.RunCatchup(ctx, 5*time.Millisecond)
	testutil.Await(t, "the leader's catalog ready", func() bool { ok, _ := c.CatalogReady(); return ok })
	if c.LeaderHTTP() != c.cfg.HTTPAdvert {
		t.Fatalf("the leader's address: %q", c.LeaderHTTP())
	}
	if c.ReadFromLeader(nil, nil) {
		t.Fatal("the leader relayed a read to itself")
	}
}

func seq(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

func intsOf[T ~uint32 | ~int32 | ~int](xs []T) []int {
	out := make([]int, len(xs))
	for i, x := range xs {
		out[i] = int(x)
	}
	return out
}

// Without a relay client New builds one with the node's name and token;
// one given is the one used; without a logger, the default one.
func TestNewFillsItsDefaults(t *testing.T) {
	c := openLeader(t)
	built := New(Config{Name: "n1", Token: "tok"}, c.cat, lone{"n1"})
	if built.Relay() == nil || built.Relay().Self() != "n1" || built.log == nil {
		t.Fatalf("defaults: relay %v, logger %v", built.Relay(), built.log)
	}
	given := relay.New("other", "")
	if got := New(Config{Name: "n1", Relay: given}, c.cat, lone{"n1"}).Relay(); got != given {
		t.Fatal("the relay client given was replaced")
	}
}

// --allow-source is checked on the directory a source opened, not on where
// its path leads a moment before or after: a symlink swapped between the
// look and the open let a dataset list a directory outside every prefix.
// Here the swap comes after the open, both ways: what was opened decides.
func TestAllowSourceIsCheckedOnWhatWasOpened(t *testing.T) {
	root := t.TempDir()
	allowed, outside := filepath.Join(root, "allowed"), filepath.Join(root, "outside")
	inside := filepath.Join(allowed, "real")
	for _, d := range []string{inside, outside} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("s"), 0o644); err != nil {
		t.Fatal(err)
	}
	prefixes, err := Resolve([]string{allowed})
	if err != nil {
		t.Fatal(err)
	}
	c := openLeaderWith(t, Config{AllowSources: prefixes})
	link := filepath.Join(allowed, "link")
	point := func(to string) {
		t.Helper()
		os.Remove(link)
		if err := os.Symlink(to, link); err != nil {
			t.Fatal(err)
		}
	}
	norm := "dir://" + link

	point(outside)
	src, err := source.Open(norm, source.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	point(inside) // the path now leads in; what was opened is still outside
	if err := c.Allowed(norm); err != nil {
		t.Fatalf("the path as it leads now: %v", err)
	}
	if err := c.AllowedOpened(norm, src); !errors.Is(err, ErrForbiddenSource) || !strings.Contains(err.Error(), "really dir://"+outside) {
		t.Fatalf("a source opened outside: %v", err)
	}

	in, err := source.Open(norm, source.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	point(outside)
	if err := c.AllowedOpened(norm, in); err != nil {
		t.Fatalf("a source opened inside, its path since leading out: %v", err)
	}
	if entries, err := in.List(bg); err != nil || len(entries) != 0 {
		t.Fatalf("the source opened inside lists %v, %v; want the empty directory it opened", entries, err)
	}
}
