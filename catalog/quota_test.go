package catalog

import (
	"errors"
	"testing"

	"stallfree/internal/testutil"
)

// A quota is replicated state: it survives a snapshot and a restart, leaves
// the dataset's version and manifest as they were, and can be lifted.
func TestQuotaThroughSnapshotAndRestart(t *testing.T) {
	dir, addr := t.TempDir(), testutil.FreeAddr(t)
	c := openLeader(t, dir, addr)
	d, _, err := c.RegisterDataset("imgs", "dir:///data", entries(100), 0)
	if err != nil {
		t.Fatal(err)
	}
	if d.Quota != nil {
		t.Fatalf("a new dataset has quota %d", *d.Quota)
	}
	q := uint64(12345)
	got, err := c.SetQuota("imgs", &q)
	if err != nil || got.Quota == nil || *got.Quota != q || got.Version != d.Version || got.Manifest != d.Manifest {
		t.Fatalf("set quota: %v %+v", err, got)
	}
	if d.Quota != nil {
		t.Fatal("the published entry was changed in place")
	}
	if _, err := c.SetQuota("nope", &q); !errors.Is(err, ErrNotFound) {
		t.Fatalf("quota on an unknown dataset: %v", err)
	}
	if err := c.raft.Snapshot().Error(); err != nil {
		t.Fatal(err)
	}
	q2 := uint64(777)
	if _, err := c.SetQuota("imgs", &q2); err != nil { // after the snapshot: replayed from the log
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	c2 := openLeader(t, dir, addr)
	defer c2.Close()
	// The entries after the snapshot are applied once the new term's first
	// entry commits: settle before reading.
	if !c2.settleAsLeader() {
		t.Fatal("the restarted leader did not settle")
	}
	back, ok := c2.Dataset("imgs")
	if !ok || back.Quota == nil || *back.Quota != q2 {
		t.Fatalf("after restart: %+v", back)
	}
	lifted, err := c2.SetQuota("imgs", nil)
	if err != nil || lifted.Quota != nil {
		t.Fatalf("lifting: %v %+v", err, lifted)
	}
}
