package node

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/internal/testutil"
	"stallfree/source"
	"stallfree/store"
)

// rewrite replaces the file behind key in the dataset's directory and moves
// its mtime on, as a generator rewriting the directory does.
func rewrite(t *testing.T, dir, key string, data []byte, at time.Time) {
	t.Helper()
	path := filepath.Join(dir, filepath.FromSlash(key))
	if err := os.WriteFile(path, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, at, at); err != nil {
		t.Fatal(err)
	}
}

// wantChanged checks err is the contract's 409 {"error": "source changed: KEY"}.
func wantChanged(t *testing.T, what string, err error, key string) {
	t.Helper()
	var ae *api.Error
	if !errors.As(err, &ae) || ae.Status != http.StatusConflict || ae.Message != "source changed: "+key || !errors.Is(err, source.ErrChanged) {
		t.Fatalf("%s: %v; want 409 source changed: %s", what, err, key)
	}
}

// Issue 47: a directory item whose size or mtime changed since registration
// is never served from other bytes. A miss reads and refuses it (409 source
// changed: KEY); a warm-up asks about the items it holds (one fstatat each),
// drops a changed one's old bytes and stops naming it; a refresh makes a new
// version whose reads are the new bytes, and the old version's items leave
// the store.
func TestChangedSourceItemsAreNotServed(t *testing.T) {
	const items, size = 4, 1 << 10
	n, d, files := startNodeWith(t, items, size, 64<<20, false, "minio")
	dir := strings.TrimPrefix(d.Source, "dir://")
	ctx := context.Background()
	held, missed := d.Manifest.Key(0), d.Manifest.Key(1)

	it, err := n.Get(ctx, d, 0)
	if err != nil {
		t.Fatal(err)
	}
	it.Release()
	later := time.Now().Add(time.Hour)
	rewrite(t, dir, held, bytes.Repeat([]byte{'n'}, len(files[held])), later) // same size: only the mtime tells

	n.StartWarmup(d)
	awaitWarmup(t, n, d)
	if p := n.WarmupProgress(d); !strings.Contains(p.Error, "source changed: "+held) {
		t.Fatalf("warm-up over a changed held item: %+v; want its error to name %s", p, held)
	}
	if n.store.Contains(store.MakeKey(d.ID, 0)) {
		t.Fatal("the warm-up kept the old bytes of a changed item")
	}
	_, err = n.Get(ctx, d, 0)
	wantChanged(t, "read of the changed item after the warm-up", err, held)

	// A miss: the item not held (the warm-up may have read it; evicted
	// now, as a full store would), then rewritten at another size.
	n.store.Delete(store.MakeKey(d.ID, 1))
	rewrite(t, dir, missed, []byte("4 bytes now"), later)
	_, err = n.Get(ctx, d, 1)
	wantChanged(t, "a miss on an item rewritten at another size", err, missed)

	info, changed, err := n.Control().RefreshDataset(ctx, "ds", "")
	if err != nil || !changed || info.ID == d.ID {
		t.Fatalf("refresh: %+v, changed %v, %v", info, changed, err)
	}
	d2, err := n.Control().Dataset(ctx, "ds")
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range map[int]string{0: strings.Repeat("n", len(files[held])), 1: "4 bytes now"} {
		it, err := n.Get(ctx, d2, i)
		if err != nil || string(it.Data) != want {
			t.Fatalf("item %d of the refreshed version: %q, %v; want %q", i, it.Data, err, want)
		}
		it.Release()
	}
	testutil.Await(t, "the old version's items to leave the store", func() bool {
		_, held := n.store.Usage()[d.ID]
		return !held
	})
}

// A held item whose file was deleted, and a missed one replaced by a
// symlink out of the dataset, are changed sources too: the warm-up drops the
// first and names it, and both reads answer source changed (the attack
// round: a warm-up that kept serving them, reads that answered 500).
func TestGoneSourceItemsAreNotServed(t *testing.T) {
	n, d, _ := startNodeWith(t, 4, 1<<10, 64<<20, false, "minio")
	dir := strings.TrimPrefix(d.Source, "dir://")
	ctx := context.Background()
	held, missed := d.Manifest.Key(2), d.Manifest.Key(3)
	it, err := n.Get(ctx, d, 2)
	if err != nil {
		t.Fatal(err)
	}
	it.Release()
	if err := os.Remove(filepath.Join(dir, filepath.FromSlash(held))); err != nil {
		t.Fatal(err)
	}
	n.StartWarmup(d)
	awaitWarmup(t, n, d)
	if p := n.WarmupProgress(d); !strings.Contains(p.Error, "source changed: "+held) {
		t.Fatalf("warm-up over a deleted held item: %+v; want its error to name %s", p, held)
	}
	if n.store.Contains(store.MakeKey(d.ID, 2)) {
		t.Fatal("the warm-up kept the bytes of a deleted item")
	}
	_, err = n.Get(ctx, d, 2)
	wantChanged(t, "read of the deleted item", err, held)

	n.store.Delete(store.MakeKey(d.ID, 3))
	outside := filepath.Join(t.TempDir(), "elsewhere")
	if err := os.WriteFile(outside, make([]byte, 1<<10), 0o644); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, filepath.FromSlash(missed))
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(outside, path); err != nil {
		t.Fatal(err)
	}
	_, err = n.Get(ctx, d, 3)
	wantChanged(t, "a miss on an item replaced by a symlink out of the dataset", err, missed)
}

// A plan that names a derived dataset (its loaders reported on it) applies
// to the others: a derived dataset takes no quota (issue 46), and refusing
// it must not leave the rest of the split unapplied.
func TestApplySplitSkipsDerivedDatasets(t *testing.T) {
	n, _, _ := startNodeWith(t, 4, 1<<10, 64<<20, false, "minio")
	ctx := context.Background()
	if _, _, err := n.Control().Leader().DeriveDataset(ctx, "dec", "ds", "decode"); err != nil {
		t.Fatal(err)
	}
	plan := api.Plan{Split: map[string]uint64{"dec": 1 << 20, "ds": 2 << 20}}
	if err := n.Split().ApplySplit(ctx, plan); err != nil {
		t.Fatalf("applying a split that names a derived dataset: %v", err)
	}
	ds, err := n.Control().Dataset(ctx, "ds")
	if err != nil || ds.Quota == nil || *ds.Quota != 2<<20 {
		t.Fatalf("ds after the split: %+v, %v; want its quota set", ds, err)
	}
	if dec, _ := n.Control().Dataset(ctx, "dec"); dec.Quota != nil {
		t.Fatalf("the derived dataset got a quota: %d", *dec.Quota)
	}
}

// A tar warm-up that finds a shard rewritten since registration drops the
// members of it this node holds (they were served as hits before) and stops
// naming one of them: 409 source changed, as for a changed file.
func TestTarWarmupOfAChangedShardDropsItsMembers(t *testing.T) {
	n, _, _, p := withTwoMembers(t, 10, 8)
	d, _ := tarDataset(t, n, 8, 12, 0)
	shards, _ := n.shardsToRead(d)
	n.StartWarmup(d)
	awaitWarmup(t, n, d)
	s := shards[0]
	first, end := d.Manifest.ShardItems(s)
	var own []int
	for i := first; i < end; i++ {
		if _, self := p.Owner(d, i); self {
			own = append(own, i)
			if !n.Split().Holds(d, i) {
				t.Fatalf("member %s not held after the first warm-up", d.Manifest.Key(i))
			}
		}
	}
	if len(own) == 0 {
		t.Fatal("this node owns no member of the shard it reads: pick other sizes")
	}
	path := filepath.Join(strings.TrimPrefix(d.Source, "tar+dir://"), d.Manifest.ShardEntry(s).Key)
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, bytes.ToUpper(b), 0o644); err != nil { // same size, other bytes, a new mtime
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	n.StartWarmup(d)
	awaitWarmup(t, n, d)
	if pr := n.WarmupProgress(d); !strings.Contains(pr.Error, "source changed: "+d.Manifest.ShardEntry(s).Key+"/") {
		t.Fatalf("the warm-up over a changed shard: %+v; want it to stop with source changed naming a member", pr)
	}
	for _, i := range own {
		if n.Split().Holds(d, i) {
			t.Fatalf("member %s of the changed shard is still held", d.Manifest.Key(i))
		}
	}
}
