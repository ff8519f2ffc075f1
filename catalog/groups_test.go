package catalog

import (
	"errors"
	"testing"

	"stallfree/internal/testutil"
)

func TestGroupsAreIdempotentSurviveRestartAndDelete(t *testing.T) {
	dir, addr := t.TempDir(), testutil.FreeAddr(t)
	c := openLeader(t, dir, addr)
	if _, _, err := c.RegisterDataset("imgs", "dir:///data", entries(10), 0); err != nil {
		t.Fatal(err)
	}
	spec := Group{Name: "hp", Dataset: "imgs", Seed: 3, BatchSize: 4, Jobs: 3, Window: 4}
	g, err := c.PutGroup(spec)
	if err != nil || g.Samples != 10 || g.Batches() != 3 || g.Version == 0 {
		t.Fatalf("put: %+v %v; want 10 samples in 3 batches", g, err)
	}
	again, err := c.PutGroup(spec)
	if err != nil || again.Version != g.Version {
		t.Fatalf("same spec again: %+v %v; want the first entry", again, err)
	}
	if _, err := c.PutGroup(Group{Name: "x", Dataset: "gone", BatchSize: 1, Jobs: 1, Window: 1}); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unknown dataset: %v", err)
	}
	if err := c.raft.Snapshot().Error(); err != nil { // the group goes into the snapshot
		t.Fatal(err)
	}
	other := spec
	other.Seed = 4
	changed, err := c.PutGroup(other) // after the snapshot: from the log
	if err != nil || changed.Version == g.Version {
		t.Fatalf("redefined: %+v %v", changed, err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c2 := openLeader(t, dir, addr)
	defer c2.Close()
	c2.settleAsLeader()
	got, ok := c2.Group("hp")
	if !ok || got.Seed != 4 || got.Version != changed.Version || len(c2.Groups()) != 1 {
		t.Fatalf("after restart: %+v %v", got, ok)
	}
	if err := c2.DeleteGroup("hp"); err != nil {
		t.Fatal(err)
	}
	if err := c2.DeleteGroup("hp"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("double delete: %v", err)
	}
}
