package control

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/catalog"
)

// Issue 47: `datasets refresh` lists the registered source again as a new
// version: a new ID (nothing cached under the old one serves it), a new
// version, the quota kept, the derived datasets gone (computed from the old
// bytes). An unchanged source is left as it is (nothing written), and a
// refresh names the registered source or none.
func TestRefreshListsTheSourceAgainAsANewVersion(t *testing.T) {
	c := openLeader(t)
	dir, norm := dataset(t, 5)
	first, _, err := c.PutDataset(bg, "ds", dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.SetQuota(bg, "ds", "", api.QuotaOf(1<<20)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Leader().DeriveDataset(bg, "ds.dec", "ds", "decode"); err != nil {
		t.Fatal(err)
	}

	same, changed, err := c.RefreshDataset(bg, "ds", "")
	if err != nil || changed || same.ID != first.ID || same.Version != first.Version {
		t.Fatalf("refresh of an unchanged source: %+v, changed %v, %v; want version %d as it was", same, changed, err, first.Version)
	}
	if !c.HasDataset("ds.dec") {
		t.Fatal("a refresh that changed nothing dropped the derived dataset")
	}

	// One file rewritten (same size, later mtime), one added.
	path := filepath.Join(dir, "xa")
	if err := os.WriteFile(path, []byte{42}, 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "zz-new"), []byte("new"), 0o644); err != nil {
		t.Fatal(err)
	}
	next, changed, err := c.RefreshDataset(bg, "ds", "dir://"+dir)
	if err != nil || !changed {
		t.Fatalf("refresh of a changed source: %+v, changed %v, %v", next, changed, err)
	}
	if next.ID == first.ID || next.Version <= first.Version || next.Items != 6 || next.Source != norm {
		t.Fatalf("refreshed %+v; want a new ID and version with 6 items (was %+v)", next, first)
	}
	if next.Quota == nil || *next.Quota != 1<<20 {
		t.Fatalf("the refresh lost the quota: %+v", next.Quota)
	}
	if c.HasDataset("ds.dec") {
		t.Fatal("the derived dataset of the old version survived the refresh")
	}

	other, _ := dataset(t, 2)
	if _, _, err := c.RefreshDataset(bg, "ds", other); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("refresh naming another source: %v; want ErrConflict", err)
	}
	if _, _, err := c.RefreshDataset(bg, "none", ""); !errors.Is(err, catalog.ErrNotFound) {
		t.Fatalf("refresh of no dataset: %v; want ErrNotFound", err)
	}
	if _, _, err := c.Leader().DeriveDataset(bg, "ds.dec2", "ds", "decode"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.RefreshDataset(bg, "ds.dec2", ""); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("refresh of a derived dataset: %v; want ErrBadRequest", err)
	}
}

// Issue 46: a quota on a derived dataset is refused with a request error
// (400) naming the parent, on the leader as on the node that got it; one
// set before can still be lifted.
func TestQuotaOnADerivedDatasetIsRefused(t *testing.T) {
	c := openLeader(t)
	dir, _ := dataset(t, 3)
	if _, _, err := c.PutDataset(bg, "ds", dir); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Leader().DeriveDataset(bg, "ds.dec", "ds", "decode"); err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct {
		name string
		set  func() error
	}{
		{"Control", func() error { _, _, err := c.SetQuota(bg, "ds.dec", "", api.QuotaOf(1<<20)); return err }},
		{"the leader", func() error { _, _, err := c.Leader().SetQuota(bg, "ds.dec", "", api.QuotaOf(1<<20)); return err }},
	} {
		if err := l.set(); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), `set the quota on "ds"`) {
			t.Fatalf("%s: a quota on a derived dataset: %v; want ErrBadRequest naming its parent", l.name, err)
		}
	}
	if d, _ := c.cat.Dataset("ds.dec"); d.Quota != nil {
		t.Fatalf("the refused quota was recorded: %d", *d.Quota)
	}
	if _, _, err := c.SetQuota(bg, "ds.dec", "", api.NoQuota()); err != nil {
		t.Fatalf("lifting a derived dataset's quota: %v", err)
	}
}

// Concurrent refreshes of a changed source make one new version, not one
// each (each new version drops every node's cached items and the derived
// datasets): those overtaken list again against it and find it unchanged.
func TestConcurrentRefreshesMakeOneVersion(t *testing.T) {
	c := openLeader(t)
	dir, _ := dataset(t, 5)
	first, _, err := c.PutDataset(bg, "ds", dir)
	if err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(dir, "xa"), later, later); err != nil {
		t.Fatal(err)
	}
	type result struct {
		d       api.Dataset
		changed bool
		err     error
	}
	results := make(chan result, 6)
	start := make(chan struct{})
	for range cap(results) {
		go func() {
			<-start
			for {
				d, changed, err := c.RefreshDataset(bg, "ds", "")
				if e, ok := errors.AsType[*api.Error](err); ok && e.Retry {
					time.Sleep(10 * time.Millisecond) // past the listings at once, as the clients do
					continue
				}
				results <- result{d, changed, err}
				return
			}
		}()
	}
	close(start)
	changed, versions := 0, map[uint64]bool{}
	for range cap(results) {
		r := <-results
		if r.err != nil {
			t.Fatal(r.err)
		}
		if r.changed {
			changed++
		}
		versions[r.d.Version] = true
	}
	final, _ := c.cat.Dataset("ds")
	if changed != 1 || len(versions) != 1 || !versions[final.Version] || final.Version == first.Version {
		t.Fatalf("%d of 6 refreshes made a version; they answered versions %v, the dataset is at %d (was %d)",
			changed, versions, final.Version, first.Version)
	}
}

// At most maxListings source listings run at once on the leader; beyond
// them a registration (or a refresh) answers 503 with Retry-After and
// records nothing, and goes through once one has ended.
func TestListingsAtOnceAreBounded(t *testing.T) {
	c := openLeader(t)
	dir, _ := dataset(t, 3)
	for range maxListings { // listings running elsewhere
		if !c.startListing() {
			t.Fatal("a listing within the bound was refused")
		}
	}
	_, _, err := c.PutDataset(bg, "ds", dir)
	if e, ok := errors.AsType[*api.Error](err); !ok || e.Status != http.StatusServiceUnavailable || !e.Retry || c.HasDataset("ds") {
		t.Fatalf("a registration past the bound: %v (registered: %v); want 503 with Retry-After", err, c.HasDataset("ds"))
	}
	// A --dataset at start waits for a listing to end rather than stopping
	// the node: within its deadline, it is still waiting.
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	if err := c.RegisterAtStart(ctx, []string{"flag=" + dir}); !strings.Contains(err.Error(), "within the start's deadline") || c.HasDataset("flag") {
		t.Fatalf("a --dataset while listings are at their bound: %v; want it to wait until its deadline", err)
	}
	c.endListing()
	if _, _, err := c.PutDataset(bg, "ds", dir); err != nil {
		t.Fatalf("a registration once a listing ended: %v", err)
	}
	c.endListing()
	if c.listing != 0 {
		t.Fatalf("%d listings counted after all ended", c.listing)
	}
}

// A --dataset not registered within the start's deadline stops the node
// with the reason (ErrDatasetFlag), rather than leaving it up and never
// ready with nothing trying again.
func TestADatasetFlagPastTheStartsDeadlineStopsTheNode(t *testing.T) {
	c := openLeader(t)
	dir, _ := dataset(t, 3)
	ctx, cancel := context.WithDeadline(bg, time.Now().Add(-time.Second))
	defer cancel()
	err := c.RegisterAtStart(ctx, []string{"ds=" + dir})
	if !errors.Is(err, ErrDatasetFlag) || !strings.Contains(err.Error(), "deadline") || c.HasDataset("ds") {
		t.Fatalf("a --dataset past the deadline: %v (registered: %v)", err, c.HasDataset("ds"))
	}
}
