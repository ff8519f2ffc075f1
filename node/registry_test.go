package node

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
	"stallfree/control"
	"stallfree/internal/testutil"
)

// Registering again with the same source changes nothing; with another
// source it is a conflict; a source that is not one is a bad request.
func TestDatasetRegistration(t *testing.T) {
	n, d, _ := startNode(t, 12, 10, 1<<20, false)
	ctx := context.Background()
	info, created, err := n.Control().PutDataset(ctx, "ds", d.Source)
	if err != nil || created || info.ID != d.ID || info.Items != 12 || info.Bytes != 120 || info.Source != d.Source {
		t.Fatalf("again: %+v created %v, %v", info, created, err)
	}
	if _, _, err := n.Control().PutDataset(ctx, "ds", t.TempDir()); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("another source: %v", err)
	}
	if _, _, err := n.Control().PutDataset(ctx, "x", "ftp://host/x"); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("unsupported scheme: %v", err)
	}
	if _, _, err := n.Control().PutDataset(ctx, "x", filepath.Join(t.TempDir(), "missing")); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("missing directory: %v", err)
	}
	r, ok := n.Control().Registration("ds")
	if !ok || r.Running || r.Listed != 12 || r.Error != "" || r.Seconds <= 0 {
		t.Fatalf("registration of ds: %+v %v", r, ok)
	}
	if r, ok := n.Control().Registration("x"); !ok || r.Running || r.Error == "" {
		t.Fatalf("the failed registration of x: %+v %v", r, ok)
	}
	if _, ok := n.Control().Registration("never"); ok {
		t.Fatal("a registration never run")
	}
	second := t.TempDir()
	for i := range 3 {
		if err := os.WriteFile(filepath.Join(second, fmt.Sprintf("f%d", i)), []byte("abc"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	info, created, err = n.Control().PutDataset(ctx, "two", second)
	if err != nil || !created || info.Items != 3 || info.ID == d.ID {
		t.Fatalf("a second dataset: %+v %v %v", info, created, err)
	}
	names := map[string]int{}
	for _, ds := range n.Control().Datasets() {
		names[ds.Name] = ds.Items
	}
	if len(names) != 2 || names["ds"] != 12 || names["two"] != 3 || !n.Control().HasDataset("two") {
		t.Fatalf("datasets %v", names)
	}
	if _, err := n.Control().Dataset(ctx, "nope"); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("unknown dataset: %v", err)
	}
}

// Deleting a dataset drops what this node cached of it and its source.
func TestDeleteDatasetDropsItsItems(t *testing.T) {
	n, d, _ := startNode(t, 12, 10, 1<<20, false)
	ctx := context.Background()
	for i := range 12 {
		it, err := n.Get(ctx, d, i)
		if err != nil {
			t.Fatal(err)
		}
		it.Release()
	}
	if err := n.Control().DeleteDataset(ctx, "ds"); err != nil {
		t.Fatal(err)
	}
	if n.Control().HasDataset("ds") {
		t.Fatal("deleted dataset still listed")
	}
	testutil.Await(t, "the deleted dataset's items to be dropped", func() bool { return n.Stats().ItemsCached == 0 })
	n.mu.Lock()
	open := len(n.sources)
	n.mu.Unlock()
	if open != 0 {
		t.Fatalf("%d sources still open", open)
	}
}

// --allow-source is applied to where a source really is: inside a prefix is
// allowed, outside is forbidden, and a symlink from inside to outside is
// forbidden under its real name.
func TestAllowSource(t *testing.T) {
	allowed, outside := t.TempDir(), t.TempDir()
	inside := filepath.Join(allowed, "data")
	if err := os.Mkdir(inside, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(allowed, "link")
	if err := os.Symlink(outside, link); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Name: "t1", ClusterKey: testutil.ClusterKey(), RaftBind: testutil.FreeAddr(t), DataDir: t.TempDir(), Bootstrap: true, Memory: 1 << 20,
		Policy: "lru", Timing: LocalTiming(), Logger: testutil.Discard(), AllowSources: []string{allowed}}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	if _, err := n.Control().CheckSource(inside); err != nil {
		t.Fatalf("inside: %v", err)
	}
	if _, err := n.Control().CheckSource(outside); !errors.Is(err, control.ErrForbiddenSource) || strings.Contains(err.Error(), "really") {
		t.Fatalf("outside: %v", err)
	}
	if _, err := n.Control().CheckSource(link); !errors.Is(err, control.ErrForbiddenSource) || !strings.Contains(err.Error(), "really") {
		t.Fatalf("a symlink out: %v", err)
	}
	if _, err := n.Control().CheckSource(filepath.Join(allowed, "missing")); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a path that does not exist: %v", err)
	}
	if _, _, err := n.Control().PutDataset(context.Background(), "x", outside); !errors.Is(err, control.ErrForbiddenSource) {
		t.Fatalf("PutDataset outside: %v", err)
	}
	if _, err := New(Config{Name: "t2", RaftBind: testutil.FreeAddr(t), DataDir: t.TempDir(), Memory: 1 << 20, Policy: "lru",
		Logger: testutil.Discard(), AllowSources: []string{filepath.Join(allowed, "missing")}}); err == nil {
		t.Fatal("an --allow-source that does not exist was accepted")
	}
	if _, err := New(Config{Name: "t2", RaftBind: testutil.FreeAddr(t), DataDir: t.TempDir(), Memory: 1 << 20, Policy: "fifo", Logger: testutil.Discard()}); err == nil {
		t.Fatal("an unknown policy was accepted")
	}
}

// --dataset flags must be NAME=SOURCE, and the node is ready only once each
// is registered.
func TestRegisterAtStartAndReady(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "a"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := Config{Name: "t1", ClusterKey: testutil.ClusterKey(), RaftBind: testutil.FreeAddr(t), DataDir: t.TempDir(), Bootstrap: true, Memory: 1 << 20,
		Policy: "lru", Timing: LocalTiming(), Logger: testutil.Discard(), Datasets: []string{"a=" + dir}}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, bad := range []string{"a", "=" + dir, "a="} {
		if err := n.Control().RegisterAtStart(ctx, []string{bad}); err == nil || !strings.Contains(err.Error(), "NAME=SOURCE") {
			t.Fatalf("%q: %v", bad, err)
		}
	}
	if err := n.cat.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	// A new leader applies its own log a moment after it is elected.
	testutil.Await(t, "the catalog caught up", func() bool { ok, _ := n.Control().CatalogReady(); ok2, _ := n.cat.CaughtUp(); return ok && ok2 })
	if ok, why := n.Ready(); ok || !strings.Contains(why, "--dataset a") {
		t.Fatalf("ready before its dataset: %v %q", ok, why)
	}
	if err := n.Control().RegisterAtStart(ctx, []string{"b=ftp://x"}); err == nil || !strings.Contains(err.Error(), "--dataset b") {
		t.Fatalf("a bad source: %v", err)
	}
	if err := n.Control().RegisterAtStart(ctx, cfg.Datasets); err != nil {
		t.Fatal(err)
	}
	// Ready also wants raft's applied index at its commit index, which it
	// reaches a moment after the write returns.
	testutil.Await(t, "readiness", func() bool { ok, _ := n.Ready(); return ok })
}

// tarShards writes shards of samples (each a .jpg and a .cls member unless
// other extensions are named, of size bytes, or of varied sizes when size is
// 0) and returns each member's bytes by key.
func tarShards(t *testing.T, shards, samples, size int, exts ...string) (string, map[string][]byte) {
	t.Helper()
	if len(exts) == 0 {
		exts = []string{"jpg", "cls"}
	}
	dir := t.TempDir()
	files := map[string][]byte{}
	for s := range shards {
		var b bytes.Buffer
		w := tar.NewWriter(&b)
		for x := range samples {
			for _, ext := range exts {
				name := fmt.Sprintf("s%02d_%03d.%s", s, x, ext)
				data := bytes.Repeat([]byte(name), 20+x)
				if size > 0 {
					data = bytes.Repeat([]byte{byte(x)}, size)
				}
				if err := w.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
					t.Fatal(err)
				}
				w.Write(data)
				files[fmt.Sprintf("shard-%02d.tar/%s", s, name)] = data
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("shard-%02d.tar", s)), b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir, files
}

// tarDataset registers shards of samples on n as dataset "wds", each sample
// a .jpg and a .cls member unless other extensions are named.
func tarDataset(t *testing.T, n *Node, shards, samples, size int, exts ...string) (*catalog.Dataset, map[string][]byte) {
	t.Helper()
	dir, files := tarShards(t, shards, samples, size, exts...)
	ctx := context.Background()
	if _, _, err := n.Control().PutDataset(ctx, "wds", "tar+dir://"+dir); err != nil {
		t.Fatal(err)
	}
	d, err := n.Control().Dataset(ctx, "wds")
	if err != nil {
		t.Fatal(err)
	}
	return d, files
}

// A tar warm-up reads each shard whose first sample this node owns once,
// front to back, keeps its own samples and pushes the others to their
// owner with their bytes; a shard another member reads is not touched.
func TestTarWarmupReadsItsShardsOnceAndPushes(t *testing.T) {
	n, _, _, p := withTwoMembers(t, 10, 8)
	d, files := tarDataset(t, n, 8, 12, 0)
	ctx := context.Background()
	shards, items := n.shardsToRead(d)
	if len(shards) == 0 || len(shards) == len(d.Manifest.Shards) {
		t.Fatalf("t1 reads %d of %d shards: pick another shard count", len(shards), len(d.Manifest.Shards))
	}
	if pr := n.WarmupProgress(d); pr.Total != int64(items) {
		t.Fatalf("progress before: %+v, want a total of %d", pr, items)
	}
	reads := n.Stats().SourceReads
	n.StartWarmup(d)
	awaitWarmup(t, n, d)
	pr := n.WarmupProgress(d)
	if pr.Done != int64(items) || pr.Total != int64(items) || pr.Full || pr.Error != "" {
		t.Fatalf("progress %+v: want %d done", pr, items)
	}
	if got := n.Stats().SourceReads - reads; got != uint64(len(shards)) {
		t.Fatalf("%d storage reads for %d shards", got, len(shards))
	}
	var wantBytes int64
	for _, s := range shards {
		first, end := d.Manifest.ShardItems(s)
		for i := first; i < end; i++ {
			key := d.Manifest.Key(i)
			owner, self := p.Owner(d, i)
			wantBytes += d.Manifest.Size(i)
			switch {
			case self && !n.Split().Holds(d, i):
				t.Fatalf("own member %s not kept", key)
			case !self && !bytes.Equal(p.pushed[i], files[key]):
				t.Fatalf("member %s of %s: pushed %d bytes, want its %d", key, owner, len(p.pushed[i]), len(files[key]))
			}
		}
	}
	if pr.Bytes != wantBytes {
		t.Fatalf("%d bytes warmed, the shards hold %d", pr.Bytes, wantBytes)
	}
	for i := range p.pushed {
		if s := int(d.Manifest.ShardOf[i]); !slices.Contains(shards, s) {
			t.Fatalf("member %d of shard %d, which t1 does not read, was pushed", i, s)
		}
	}

	// A sample batch: members sample after sample, with the files' bytes.
	items2, spans, err := n.GetSamplesFor(ctx, d, []int{3, 0}, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(spans) != 2 || spans[0].Key != d.Manifest.SampleKey(3) || spans[0].End != 2 || spans[1].End != 4 || len(items2) != 4 {
		t.Fatalf("spans %+v, %d items", spans, len(items2))
	}
	for _, it := range items2 {
		if !bytes.Equal(it.Data, files[it.Key]) {
			t.Fatalf("member %s differs from the shard's", it.Key)
		}
		it.Release()
	}
	for _, bad := range [][]int{{-1}, {d.Manifest.Samples()}} {
		if _, _, err := n.GetSamplesFor(ctx, d, bad, ""); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("samples %v: %v", bad, err)
		}
	}
	if _, _, err := n.GetSamplesFor(ctx, d, make([]int, MaxBatch+1), ""); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("too many samples: %v", err)
	}
	plain, err := n.Control().Dataset(ctx, "ds")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := n.GetSamplesFor(ctx, plain, []int{0}, ""); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("samples of a plain dataset: %v", err)
	}
}

// A job on a tar dataset reads batches of samples.
func TestJobBatchesOfSamples(t *testing.T) {
	n, _, _ := startNode(t, 4, 8, 1<<20, false)
	_, files := tarDataset(t, n, 2, 5, 0)
	ctx := context.Background()
	putJob(t, n, api.Job{Name: "tj", Dataset: "wds", Seed: 1, WorldSize: 1, BatchSize: 3})
	o, err := n.Control().RankOrder(ctx, "tj", 0, 0)
	if err != nil || len(o.Indices) != 10 || o.Batches != 4 {
		t.Fatalf("order %+v, %v: want 10 samples in 4 batches", o, err)
	}
	items, spans, err := n.JobBatch(ctx, "tj", 0, 0, 3)
	if err != nil || len(spans) != 1 || len(items) != 2 || spans[0].End != 2 {
		t.Fatalf("last batch: %d items, spans %+v, %v", len(items), spans, err)
	}
	for _, it := range items {
		if !bytes.Equal(it.Data, files[it.Key]) {
			t.Fatalf("member %s differs", it.Key)
		}
		it.Release()
	}
}

// When the owner keeps nothing pushed, the warm-up ends full.
func TestTarWarmupStopsForAFullOwner(t *testing.T) {
	n, _, _, p := withTwoMembers(t, 10, 8)
	p.full = true
	d, _ := tarDataset(t, n, 8, 12, 0)
	n.StartWarmup(d)
	awaitWarmup(t, n, d)
	if pr := n.WarmupProgress(d); !pr.Full || pr.Error != "" {
		t.Fatalf("progress %+v: want full", pr)
	}
	if len(p.pushed) != 0 || len(p.pushes) == 0 {
		t.Fatalf("%d pushes, %d kept", len(p.pushes), len(p.pushed))
	}
}

// Unset limits take their documented defaults (docs/operations.md); set
// ones are kept.
func TestConfigDefaults(t *testing.T) {
	open := func(cfg Config) Config {
		t.Helper()
		cfg.Name, cfg.RaftBind, cfg.DataDir, cfg.Policy, cfg.Logger = "t1", testutil.FreeAddr(t), t.TempDir(), "lru", testutil.Discard()
		n, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer n.Close()
		if n.inflight.limit != n.cfg.MaxInflightBytes {
			t.Fatalf("in-flight budget %d, config %d", n.inflight.limit, n.cfg.MaxInflightBytes)
		}
		return n.cfg
	}
	got := open(Config{Memory: 1 << 20})
	if got.StorageTimeout != 30*time.Second || got.StorageReaders != 64 || got.MaxInflightBytes != 256<<20 || got.RaftAdvert != got.RaftBind {
		t.Fatalf("defaults: timeout %v, readers %d, in flight %d, raft advert %q", got.StorageTimeout, got.StorageReaders, got.MaxInflightBytes, got.RaftAdvert)
	}
	if got.Timing != LANTiming() {
		t.Fatalf("the zero timing runs as %+v, want the LAN profile", got.Timing)
	}
	// Hosts on a network are given more time than loopback, and a sweep
	// period must be positive for its ticker to exist.
	if lan, local := LANTiming(), LocalTiming(); local.Rehome <= 0 || lan.Rehome <= local.Rehome {
		t.Fatalf("rehome periods: LAN %v, local %v", lan.Rehome, local.Rehome)
	}
	if got := open(Config{Memory: 2 << 30}); got.MaxInflightBytes != 512<<20 {
		t.Fatalf("in-flight default for 2 GiB: %d, want a quarter", got.MaxInflightBytes)
	}
	// No logger: the default one, not a nil one every log call would crash on.
	quiet, err := New(Config{Name: "t1", RaftBind: testutil.FreeAddr(t), DataDir: t.TempDir(), Policy: "lru", Memory: 1 << 20})
	if err != nil {
		t.Fatal(err)
	}
	if quiet.log == nil || quiet.cfg.Logger == nil {
		t.Fatal("a node without a logger has none")
	}
	quiet.Close()
	got = open(Config{Memory: 1 << 20, StorageTimeout: time.Second, StorageReaders: 3, MaxInflightBytes: 5, RaftAdvert: "10.0.0.1:7000", Timing: LocalTiming()})
	if got.StorageTimeout != time.Second || got.StorageReaders != 3 || got.MaxInflightBytes != 5 || got.RaftAdvert != "10.0.0.1:7000" ||
		got.Timing != LocalTiming() {
		t.Fatalf("set values replaced: %+v", got)
	}
}

// largestPush warms d on n to the end and returns the most samples and the
// most bytes one push to t2 held.
func largestPush(t *testing.T, n *Node, d *catalog.Dataset, p *twoMembers) (items, bytes int) {
	t.Helper()
	if shards, _ := n.shardsToRead(d); len(shards) == 0 {
		t.Fatal("t1 reads no shard: pick another count")
	}
	n.StartWarmup(d)
	awaitWarmup(t, n, d)
	if pr := n.WarmupProgress(d); pr.Done != pr.Total || pr.Error != "" {
		t.Fatalf("progress %+v", pr)
	}
	for x := range p.pushes {
		items, bytes = max(items, p.counts[x]), max(bytes, p.pushes[x])
	}
	return items, bytes
}

// A warm-up push holds at most pushItems samples and at most its byte bound,
// and fills to exactly either when the samples are small or divide it.
func TestTarWarmupPushesAreBounded(t *testing.T) {
	testutil.Long(t)
	for _, tc := range []struct {
		shards, samples, size int
		items, bytes          int // the largest push's, 0: not checked
	}{
		{shards: 6, samples: 700, items: pushItems},
		{shards: 8, samples: 24, size: pushBytes / 16, bytes: pushBytes},
	} {
		n, _, _, p := withTwoMembers(t, 10, 8)
		d, _ := tarDataset(t, n, tc.shards, tc.samples, tc.size)
		items, bytes := largestPush(t, n, d, p)
		if tc.items != 0 && items != tc.items || tc.bytes != 0 && bytes != tc.bytes {
			t.Fatalf("%+v: the largest push held %d samples, %d bytes", tc, items, bytes)
		}
	}
}

// With more members each owner's push is smaller, so that what one shard's
// reader holds for all of them stays bounded: 16 MiB over 8 members.
func TestTarWarmupPushesShrinkWithTheCluster(t *testing.T) {
	n, _, _, p := withTwoMembers(t, 10, 8)
	names := []string{"t1", "t2"}
	for x := range 6 {
		names = append(names, fmt.Sprintf("o%d", x))
	}
	p.setRing(t, names...)
	p.owner = func(i int) string { return names[i%2] } // t1 reads every shard and pushes half to t2
	const limit = pendingBytes / 8
	d, _ := tarDataset(t, n, 1, 64, limit/32)
	if _, most := largestPush(t, n, d, p); most != limit {
		t.Fatalf("the largest push to t2 held %d bytes, want exactly %d", most, limit)
	}
}
