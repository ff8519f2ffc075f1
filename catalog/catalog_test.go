package catalog

import (
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"stallfree/internal/testutil"
	"stallfree/source"
)

func openLeader(t *testing.T, dir, addr string) *Catalog {
	t.Helper()
	c, err := Open(Config{Key: testutil.ClusterKey(), NodeID: "n1", Bind: addr, Dir: dir, Bootstrap: true, Timing: LocalTiming()})
	if err != nil {
		t.Fatal(err)
	}
	// The only voter leads once an election has run (Leader() may name it a
	// moment before its state says so, so poll the state itself).
	for deadline := time.Now().Add(10 * time.Second); !c.IsLeader(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("never became leader (leader %q)", c.Leader())
		}
	}
	return c
}

func entries(n int) []source.Entry {
	out := make([]source.Entry, n)
	for i := range out {
		out[i] = source.Entry{Key: fmt.Sprintf("train/n%08d/img_%08d.JPEG", i/1300, i), Size: int64(100 + i%5000)}
	}
	return out
}

func TestRegisterRestartAndIdempotence(t *testing.T) {
	dir, addr := t.TempDir(), testutil.FreeAddr(t)
	c := openLeader(t, dir, addr)
	d, created, err := c.RegisterDataset("imgs", "dir:///data", entries(1000), 3)
	if err != nil || !created {
		t.Fatalf("register: %v %v", created, err)
	}
	if d.Manifest.LeftOut != 3 {
		t.Fatalf("%d left out, want the 3 the listing reported once", d.Manifest.LeftOut)
	}
	if d.Manifest.Len() != 1000 || d.Manifest.Key(7) != entries(1000)[7].Key {
		t.Fatalf("manifest wrong")
	}
	again, created, err := c.RegisterDataset("imgs", "dir:///data", entries(1000), 0)
	if err != nil || created || again.Version != d.Version || again.ID != d.ID {
		t.Fatalf("re-register: %v %v %+v", created, err, again)
	}
	if _, _, err := c.RegisterDataset("imgs", "dir:///other", entries(3), 0); !errors.Is(err, ErrConflict) {
		t.Fatalf("conflict: %v", err)
	}
	if _, err := c.PutJob(Job{Name: "j", Dataset: "imgs", Seed: 1, WorldSize: 2, BatchSize: 4, Ranks: []string{"a", "b"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutJob(Job{Name: "k", Dataset: "nope"}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("job on unknown dataset: %v", err)
	}
	// Half the history goes into a snapshot, the rest stays in the log: a restart
	// must replay both.
	if err := c.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.RegisterDataset("second", "dir:///s", entries(10), 0); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	c2 := openLeader(t, dir, addr)
	defer c2.Close()
	got, ok := c2.Dataset("imgs")
	if !ok || got.Manifest.Len() != 1000 || got.ID != d.ID || got.Source != "dir:///data" {
		t.Fatalf("after restart: %+v", got)
	}
	if _, ok := c2.Dataset("second"); !ok {
		t.Fatal("log entries after the snapshot were lost")
	}
	// A lookup that misses on the leader asks again once the leader has
	// applied everything before its term: that is settled here.
	if !c2.settleAsLeader() || c2.settledTerm.Load() != c2.raft.CurrentTerm() {
		t.Fatal("the leader did not settle its term")
	}
	if j, ok := c2.Job("j"); !ok || j.WorldSize != 2 {
		t.Fatal("job lost")
	}
	if err := c2.DeleteDataset("imgs"); err != nil {
		t.Fatal(err)
	}
	if err := c2.DeleteDataset("imgs"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("double delete: %v", err)
	}
}

func TestImageNetSizedManifestStaysUnderEntryLimit(t *testing.T) {
	testutil.Long(t)
	es := entries(1_281_167)
	parts := chunks(es, maxChunkKeyBytes)
	total := 0
	for _, p := range parts {
		b, err := msgpack.Marshal(&command{Op: opChunk, Name: "imagenet", Token: newToken(), Chunk: NewManifest(p)})
		if err != nil {
			t.Fatal(err)
		}
		if len(b) >= 1<<20 {
			t.Fatalf("raft entry of %d bytes", len(b))
		}
		total += len(p)
	}
	if total != len(es) || len(parts) < 2 {
		t.Fatalf("%d entries in %d chunks", total, len(parts))
	}
	m := &Manifest{}
	for _, p := range parts {
		m.appendChunk(NewManifest(p))
	}
	for _, i := range []int{0, 1, 640_000, len(es) - 1} {
		if m.Key(i) != es[i].Key || m.Size(i) != es[i].Size {
			t.Fatalf("entry %d differs after chunking", i)
		}
		if j, ok := m.Index(es[i].Key); !ok || j != i {
			t.Fatalf("Index(%q) = %d %v", es[i].Key, j, ok)
		}
	}
	if _, ok := m.Index("train/zzz"); ok {
		t.Fatal("found a key that is not there")
	}
}

// A job whose rank layout alone changes keeps the generation it replaced,
// with its epochs' member pins, through a snapshot and a restart; any other
// change, or none, keeps no previous generation.
func TestResizedJobKeepsItsPreviousGeneration(t *testing.T) {
	dir, addr := t.TempDir(), testutil.FreeAddr(t)
	c := openLeader(t, dir, addr)
	if _, _, err := c.RegisterDataset("imgs", "dir:///data", entries(100), 0); err != nil {
		t.Fatal(err)
	}
	first, err := c.PutJob(Job{Name: "j", Dataset: "imgs", Seed: 1, WorldSize: 4, BatchSize: 8, Ranks: []string{"a", "b", "c", "d"}})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := c.PinEpoch("j", 3, []string{"a", "b", "c", "d"}); err != nil || !slices.Equal(m, []string{"a", "b", "c", "d"}) {
		t.Fatalf("pin: %v %v", m, err)
	}
	if m, err := c.PinEpoch("j", 3, []string{"a", "b"}); err != nil || len(m) != 4 {
		t.Fatalf("a second pin of epoch 3: %v %v, want the first pin's 4 members", m, err)
	}
	same, err := c.PutJob(Job{Name: "j", Dataset: "imgs", Seed: 1, WorldSize: 4, BatchSize: 8, Ranks: []string{"a", "b", "c", "d"}})
	if err != nil || same.Version != first.Version || same.Prev != nil {
		t.Fatalf("the same job again: %+v %v", same, err)
	}
	resized, err := c.PutJob(Job{Name: "j", Dataset: "imgs", Seed: 1, WorldSize: 3, BatchSize: 8, Ranks: []string{"a", "b", "c"}})
	if err != nil {
		t.Fatal(err)
	}
	p := resized.Prev
	if p == nil || p.Version != first.Version || p.WorldSize != 4 || len(p.Ranks) != 4 || len(p.Pins[3]) != 4 {
		t.Fatalf("resized: previous generation %+v, want version %d with 4 ranks and epoch 3's pin", p, first.Version)
	}
	if _, ok := c.EpochMembers("j", 3); ok {
		t.Fatal("the new generation inherited the old one's pins")
	}
	if err := c.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c = openLeader(t, dir, addr)
	defer c.Close()
	if j, ok := c.Job("j"); !ok || j.Prev == nil || j.Prev.Version != first.Version || len(j.Prev.Pins[3]) != 4 {
		t.Fatalf("after a restart: %+v", j)
	}
	reseeded, err := c.PutJob(Job{Name: "j", Dataset: "imgs", Seed: 2, WorldSize: 3, BatchSize: 8, Ranks: []string{"a", "b", "c"}})
	if err != nil || reseeded.Prev != nil {
		t.Fatalf("another seed is another job, with nothing to resume: %+v %v", reseeded, err)
	}
}
