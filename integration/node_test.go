package integration

import (
	"bytes"
	"context"
	"sync"
	"testing"
	"time"

	"stallfree/client"

	"stallfree/api"
	"stallfree/internal/testutil"
)

// A node killed with SIGKILL and restarted on the same --data-dir comes back
// with its catalog from its raft log.
func TestCatalogSurvivesRestart(t *testing.T) {
	dir, files := dataset(t, 20, 2000)
	n := startNode(t, nodeOpts{name: "solo", bootstrap: true, extra: []string{"--dataset", "boot=" + dir}})
	ctx := context.Background()
	testutil.AwaitWithin(t, 20*time.Second, "dataset from --dataset", func() bool {
		ds, err := n.c.Datasets(ctx)
		return err == nil && len(ds) == 1
	})
	if _, err := n.c.PutDataset(ctx, "added", "dir://"+dir); err != nil {
		t.Fatal(err)
	}
	if _, err := n.c.PutJob(ctx, api.Job{Name: "train", Dataset: "added", Seed: 7, WorldSize: 1, BatchSize: 4}); err != nil {
		t.Fatal(err)
	}
	before, err := n.c.Datasets(ctx)
	if err != nil || len(before) != 2 {
		t.Fatalf("datasets before the restart: %v %v", before, err)
	}
	n.kill()
	n.start()
	var after []client.Dataset
	testutil.AwaitWithin(t, 20*time.Second, "catalog after restart", func() bool {
		var err error
		after, err = n.c.Datasets(ctx)
		return err == nil && len(after) == 2
	})
	for i := range before {
		if before[i] != after[i] {
			t.Fatalf("dataset changed across restart: %+v -> %+v", before[i], after[i])
		}
	}
	var jobs []map[string]any
	if err := n.c.JSON(ctx, "GET", "/v1/jobs", nil, &jobs); err != nil || len(jobs) != 1 {
		t.Fatalf("jobs after restart: %v %v", jobs, err)
	}
	for key, want := range files {
		it, err := n.c.ItemByKey(ctx, "added", key)
		if err != nil || !bytes.Equal(it.Data, want) {
			t.Fatalf("%s after restart: %v", key, err)
		}
	}
}

// Many loaders missing on the same items at once cause one storage read per item.
func TestConcurrentMissesReadOnce(t *testing.T) {
	testutil.Long(t)
	dir, files := dataset(t, 100, 30000)
	n := startNode(t, nodeOpts{name: "solo", bootstrap: true})
	ctx := context.Background()
	testutil.AwaitWithin(t, 20*time.Second, "leader", func() bool {
		_, err := n.c.PutDataset(ctx, "ds", dir)
		return err == nil
	})
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 100 {
				it, err := n.c.ItemByIndex(ctx, "ds", i)
				if err != nil || !bytes.Equal(it.Data, files[it.Key]) {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("loader: %v", err)
	}
	s, err := n.c.Stats(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.SourceReads != 100 || s.HitsLocal+s.Misses != 1600 {
		t.Fatalf("16 loaders x 100 items: %d storage reads (want 100), %+v", s.SourceReads, s)
	}
}
