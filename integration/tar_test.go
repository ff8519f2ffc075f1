package integration

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
	"stallfree/client"
	"stallfree/internal/testutil"
)

// wds is a WebDataset written for a test: shards by Go's archive/tar plus one
// by GNU tar, and what a cluster must make of them.
type wds struct {
	dir     string
	keys    []string          // items in manifest order (shard, then archive order)
	bytes   map[string][]byte // by item key
	samples []client.Sample   // in sample order
	total   int64             // member bytes
}

func (w *wds) add(shard, name string, b []byte) {
	key := shard + "/" + name
	w.keys = append(w.keys, key)
	w.bytes[key] = b
	w.total += int64(len(b))
	base := name[strings.LastIndexByte(name, '/')+1:]
	skey := shard + "/" + name[:len(name)-len(base)+strings.IndexByte(base, '.')]
	ext := base[strings.IndexByte(base, '.')+1:]
	if n := len(w.samples); n == 0 || w.samples[n-1].Key != skey {
		w.samples = append(w.samples, client.Sample{Key: skey, Parts: map[string][]byte{}})
	}
	w.samples[len(w.samples)-1].Parts[ext] = b
}

// makeWDS writes shards of perShard samples (.jpg of ~size bytes, .cls,
// .json), a "../evil.jpg" member in the first shard, and a last shard made by
// GNU tar from a directory.
func makeWDS(t *testing.T, samples, perShard, size int) *wds {
	t.Helper()
	w := &wds{dir: t.TempDir(), bytes: map[string][]byte{}}
	r := rand.New(rand.NewPCG(uint64(samples), 9))
	for first := 0; first < samples; first += perShard {
		shard := fmt.Sprintf("train-%04d.tar", first/perShard)
		f, err := os.Create(filepath.Join(w.dir, shard))
		if err != nil {
			t.Fatal(err)
		}
		tw := tar.NewWriter(f)
		put := func(name string, b []byte) {
			if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(b)), Typeflag: tar.TypeReg}); err != nil {
				t.Fatal(err)
			}
			if _, err := tw.Write(b); err != nil {
				t.Fatal(err)
			}
		}
		if first == 0 {
			put("../evil.jpg", []byte("outside the shard's names")) // left out
		}
		for i := first; i < min(first+perShard, samples); i++ {
			jpg := make([]byte, size/2+r.IntN(size))
			for j := range jpg {
				jpg[j] = byte(r.Uint32())
			}
			for _, m := range []struct {
				ext string
				b   []byte
			}{{"jpg", jpg}, {"cls", fmt.Appendf(nil, "%d", i%10)}, {"json", fmt.Appendf(nil, `{"i":%d}`, i)}} {
				name := fmt.Sprintf("s%06d.%s", i, m.ext)
				put(name, m.b)
				w.add(shard, name, m.b)
			}
		}
		if err := tw.Close(); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	src := t.TempDir()
	gnu := map[string][]byte{"g1.jpg": bytes.Repeat([]byte("g"), 3000), "g1.cls": []byte("7"), "g2.jpg": []byte("second")}
	for name, b := range gnu {
		if err := os.WriteFile(filepath.Join(src, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := exec.Command("tar", "--sort=name", "-cf", filepath.Join(w.dir, "zz-gnu.tar"), "-C", src, "g1.cls", "g1.jpg", "g2.jpg").CombinedOutput()
	if err != nil {
		t.Fatalf("GNU tar: %v: %s", err, out)
	}
	for _, name := range []string{"g1.cls", "g1.jpg", "g2.jpg"} {
		w.add("zz-gnu.tar", name, gnu[name])
	}
	return w
}

// hasStatus reports whether err is the API's answer with that status.
func hasStatus(err error, status int) bool {
	e, ok := errors.AsType[*api.Error](err)
	return ok && e.Status == status
}

// shardBytes is the size of all shards on disk.
func (w *wds) shardBytes(t *testing.T) int64 {
	t.Helper()
	entries, err := os.ReadDir(w.dir)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	for _, e := range entries {
		fi, err := e.Info()
		if err != nil {
			t.Fatal(err)
		}
		total += fi.Size()
	}
	return total
}

func sameSample(a, b client.Sample) bool {
	if a.Key != b.Key || len(a.Parts) != len(b.Parts) {
		return false
	}
	for ext, v := range a.Parts {
		if !bytes.Equal(v, b.Parts[ext]) {
			return false
		}
	}
	return true
}

// A tar dataset on a 4-node cluster: the catalog, every member's bytes, sample
// maps and batches, a warm-up that reads each shard once cluster-wide and
// keeps each sample on one node, and job orders over samples that stay local.
func TestTarDatasetOnACluster(t *testing.T) {
	testutil.Long(t)
	const samples, world, batch = 2048, 4, 256
	w := makeWDS(t, samples, 300, 1024)
	nodes := startCluster(t, clusterOpts{nodes: world})
	ctx := context.Background()
	register(t, nodes[0], "wds", "tar+dir://"+w.dir)
	info, err := nodes[2].c.Dataset(ctx, "wds")
	if err != nil {
		t.Fatal(err)
	}
	// How far the registration got, asked of any member (the leader, which
	// indexed the shards, answers).
	for _, n := range nodes {
		reg, err := n.c.Registration(ctx, "wds")
		if err != nil || reg.Running || reg.Shards != 8 || reg.ShardsDone != 8 || reg.Listed != int64(len(w.keys)) || reg.Error != "" {
			t.Fatalf("%s: registration %+v, %v; want 8 of 8 shards and %d members, ended", n.name, reg, err, len(w.keys))
		}
	}
	if _, err := nodes[1].c.Registration(ctx, "never-registered"); !hasStatus(err, http.StatusNotFound) {
		t.Fatalf("registration of an unknown dataset: %v, want 404", err)
	}
	if info.Items != len(w.keys) || info.Samples != len(w.samples) || info.Bytes != w.total || info.LeftOut != 1 || info.Shards != 8 {
		t.Fatalf("dataset info %+v; want %d items, %d samples, %d bytes, 8 shards, 1 member left out",
			info, len(w.keys), len(w.samples), w.total)
	}

	// Warm-up first: each shard read from storage once in the whole cluster,
	// front to back (its bytes once, bar the archive's end blocks), and
	// every member cached.
	for _, n := range nodes {
		if _, err := n.c.StartWarmup(ctx, "wds"); err != nil {
			t.Fatal(err)
		}
	}
	testutil.AwaitWithin(t, 60*time.Second, "warm-up", func() bool { return sumStats(t, nodes).ItemsCached == len(w.keys) })
	warmed := sumStats(t, nodes)
	var sourceBytes, pushed uint64
	for _, n := range nodes {
		st := mustStats(t, n)
		sourceBytes += st.SourceBytes
		pushed += st.PeerBytesIn
	}
	shardBytes := w.shardBytes(t)
	if warmed.SourceReads != uint64(info.Shards) || sourceBytes < uint64(w.total) || sourceBytes > uint64(shardBytes) {
		t.Fatalf("warm-up made %d storage reads of %d bytes; want one per shard (%d), %d to %d bytes",
			warmed.SourceReads, sourceBytes, info.Shards, w.total, shardBytes)
	}
	// The shards' readers kept about a quarter and pushed the rest.
	if pushed < uint64(w.total)/2 || pushed > uint64(w.total) {
		t.Fatalf("%d bytes pushed to owners in a warm-up of %d bytes over 4 nodes", pushed, w.total)
	}

	// Every member by index and by key, through two nodes, from memory.
	for i, key := range w.keys {
		n := nodes[i%2]
		it, err := n.c.ItemByIndex(ctx, "wds", i)
		if err != nil || it.Key != key || !bytes.Equal(it.Data, w.bytes[key]) {
			t.Fatalf("%s index %d: key %q err %v; want %q and its bytes", n.name, i, it.Key, err, key)
		}
		if i%7 == 0 {
			byKey, err := n.c.ItemByKey(ctx, "wds", key)
			if err != nil || !bytes.Equal(byKey.Data, w.bytes[key]) {
				t.Fatalf("%s key %s: %v", n.name, key, err)
			}
		}
	}
	// Samples one by one and in batches, in request order.
	for s := 0; s < len(w.samples); s += 97 {
		got, err := nodes[3].c.Sample(ctx, "wds", s)
		if err != nil || !sameSample(got, w.samples[s]) {
			t.Fatalf("sample %d: %+v %v; want %s", s, got.Key, err, w.samples[s].Key)
		}
	}
	order := rand.New(rand.NewPCG(1, 2)).Perm(len(w.samples))[:300]
	got, err := nodes[1].c.Samples(ctx, "wds", order)
	if err != nil || len(got) != len(order) {
		t.Fatalf("sample batch: %d samples, %v", len(got), err)
	}
	for x, s := range order {
		if !sameSample(got[x], w.samples[s]) {
			t.Fatalf("sample batch position %d: %s, want %s", x, got[x].Key, w.samples[s].Key)
		}
	}
	if _, err := nodes[0].c.Sample(ctx, "wds", len(w.samples)); err == nil {
		t.Fatal("a sample past the end was served")
	}
	if s := sumStats(t, nodes); s.SourceReads != warmed.SourceReads {
		t.Fatalf("%d storage reads after the warm-up, want none", s.SourceReads-warmed.SourceReads)
	}

	// Each sample lives on one node: every member answers from the same place.
	for s, sm := range w.samples {
		if s%11 != 0 {
			continue
		}
		var where []string
		for i, key := range w.keys {
			if strings.HasPrefix(key, sm.Key+".") {
				it, err := nodes[0].c.ItemByIndex(ctx, "wds", i)
				if err != nil {
					t.Fatal(err)
				}
				where = append(where, it.Cache)
			}
		}
		if len(slices.Compact(where)) != 1 {
			t.Fatalf("sample %s: members answered from %v, want one node", sm.Key, where)
		}
	}

	// A job over samples: each epoch's rank orders partition the samples and
	// each rank's batches come almost wholly from its own node.
	job := api.Job{Name: "wjob", Dataset: "wds", Seed: 3, WorldSize: world, BatchSize: batch, Ranks: names(nodes)}
	if _, err := nodes[0].c.PutJob(ctx, job); err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	var local, peer uint64
	for r, n := range nodes {
		o := rankOrder(t, n, "wjob", 0, r)
		if len(o.Indices) != len(w.samples)/world {
			t.Fatalf("rank %d: %d samples, want %d", r, len(o.Indices), len(w.samples)/world)
		}
		before := mustStats(t, n)
		for b := range o.Batches {
			got := jobSamples(t, n, "wjob", 0, r, b)
			want := o.Indices[b*batch : min((b+1)*batch, len(o.Indices))]
			for x, s := range want {
				if seen[s] {
					t.Fatalf("sample %d given twice", s)
				}
				seen[s] = true
				if x >= len(got) || !sameSample(got[x], w.samples[s]) {
					t.Fatalf("rank %d batch %d position %d: not sample %d", r, b, x, s)
				}
			}
		}
		after := mustStats(t, n)
		local += after.HitsLocal - before.HitsLocal
		peer += after.HitsPeer - before.HitsPeer
	}
	frac := float64(peer) / float64(local+peer)
	t.Logf("tar job: %.3f of members came from another node (%d local, %d peer)", frac, local, peer)
	if !(frac <= 0.05) {
		t.Fatalf("remote fraction %.3f > 0.05", frac)
	}
}

func jobSamples(t *testing.T, n *proc, job string, epoch, rank, b int) []client.Sample {
	t.Helper()
	resp, err := n.c.Do(context.Background(), "GET", fmt.Sprintf("/v1/jobs/%s/epochs/%d/ranks/%d/batches/%d", job, epoch, rank, b), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []client.Sample
	if err := msgpack.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// A truncated shard fails the registration, naming the shard and where it
// broke, and registers nothing.
func TestTarTruncatedShardRegistersNothing(t *testing.T) {
	w := makeWDS(t, 20, 10, 2000)
	path := filepath.Join(w.dir, "train-0001.tar")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b[:len(b)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, nodeOpts{name: "n1", bootstrap: true})
	ctx := context.Background()
	var regErr error
	testutil.AwaitWithin(t, 30*time.Second, "an answer from the leader", func() bool {
		_, regErr = n.c.PutDataset(ctx, "wds", "tar+dir://"+w.dir)
		return regErr == nil || !strings.Contains(regErr.Error(), "leader")
	})
	var ae *client.Error
	if !errors.As(regErr, &ae) || ae.Status/100 != 4 || !strings.Contains(ae.Message, "train-0001.tar at byte") {
		t.Fatalf("registering a truncated shard: %v; want a 4xx naming train-0001.tar and an offset", regErr)
	}
	if ds, err := n.c.Datasets(ctx); err != nil || len(ds) != 0 {
		t.Fatalf("datasets after a failed registration: %v %v; want none", ds, err)
	}
}
