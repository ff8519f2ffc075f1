package catalog

import (
	"errors"
	"testing"

	"stallfree/internal/testutil"
)

// A refresh lands only on the version its listing was compared with. One
// overtaken by another refresh is ErrMoved; one whose dataset was deleted
// while it listed is ErrNotFound. Nothing is recorded either way: the name
// keeps what it held, or stays gone rather than coming back without its
// quota. (A delete waits for a registration in flight: the same lock.)
func TestARefreshLandsOnlyOnTheVersionItListedAgainst(t *testing.T) {
	c := openLeader(t, t.TempDir(), testutil.FreeAddr(t))
	defer c.Close()
	v1, _, err := c.RegisterDataset("ds", "dir:///data", entries(10), 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.SetQuota("ds", new(uint64(1<<20))); err != nil {
		t.Fatal(err)
	}
	v2, err := c.RefreshDataset("ds", "dir:///data", v1.Version, entries(11), 0)
	if err != nil || v2.Version == v1.Version || v2.Quota == nil {
		t.Fatalf("a refresh from the registered version: %+v %v", v2, err)
	}
	if _, err := c.RefreshDataset("ds", "dir:///data", v1.Version, entries(12), 0); !errors.Is(err, ErrMoved) {
		t.Fatalf("a refresh overtaken by another: %v; want ErrMoved", err)
	}
	if d, _ := c.Dataset("ds"); d.Version != v2.Version || d.Manifest.Len() != 11 {
		t.Fatalf("an overtaken refresh changed the dataset: version %d, %d items", d.Version, d.Manifest.Len())
	}

	if err := c.DeleteDataset("ds"); err != nil {
		t.Fatal(err)
	}
	// Deleted before the begin.
	if _, err := c.RefreshDataset("ds", "dir:///data", v2.Version, entries(3), 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("a refresh of a deleted dataset: %v; want ErrNotFound", err)
	}
	if d, ok := c.Dataset("ds"); ok {
		t.Fatalf("a deleted dataset came back by a refresh: %+v", d)
	}
	// Without a version (log entries from before), a refresh registers as
	// it did.
	if d, err := c.RefreshDataset("ds", "dir:///data", 0, entries(3), 0); err != nil || d.Manifest.Len() != 3 {
		t.Fatalf("a refresh without a version: %+v %v", d, err)
	}
}
