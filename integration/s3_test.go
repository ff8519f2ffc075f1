package integration

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/internal/testutil"
	"stallfree/miniotest"
)

func apiStatus(err error) int {
	if e, ok := errors.AsType[*api.Error](err); ok {
		return e.Status
	}
	return 0
}

// Three nodes read a bucket prefix from a real MinIO server: each object is
// read from S3 once cluster-wide and held by exactly one node, every node
// serves every object byte-exact; storage errors come back as the contract
// says, and MinIO stopping costs only what was not cached.
func TestS3DatasetOnThreeNodes(t *testing.T) {
	testutil.Long(t)
	const items = 2000
	srv := miniotest.Start(t)
	srv.Bucket("train")
	objects, files := miniotest.Objects("imagenet/train/", items)
	_, small := miniotest.Objects("small/", 20)
	for k, b := range small {
		objects["small/"+k] = b
	}
	objects["elsewhere/x.jpg"] = []byte("outside the prefix")
	srv.Put("train", objects)

	nodes := startCluster(t, clusterOpts{nodes: 3, env: miniotest.CredentialsEnv(),
		extra: []string{"--s3-endpoint", srv.Endpoint, "--storage-timeout", "3s"}})
	ctx := context.Background()
	d, err := nodes[0].c.PutDataset(ctx, "ds", "s3://train/imagenet/train/")
	if err != nil {
		t.Fatal(err)
	}
	if d.Items != items || d.Source != "s3://train/imagenet/train" {
		t.Fatalf("registered %+v, want %d items from s3://train/imagenet/train", d, items)
	}

	for _, n := range nodes {
		if _, err := n.c.StartWarmup(ctx, "ds"); err != nil {
			t.Fatal(err)
		}
	}
	testutil.AwaitWithin(t, 60*time.Second, "warm-up", func() bool {
		for _, n := range nodes {
			p, err := n.c.Warmup(ctx, "ds")
			if err != nil || p.Running || p.Done != p.Total {
				return false
			}
		}
		return true
	})
	if s := sumStats(t, nodes); s.SourceReads != items || s.ItemsCached != items {
		t.Fatalf("after warm-up: %d S3 reads and %d items cached, want %d each", s.SourceReads, s.ItemsCached, items)
	}
	// Every node serves every object byte-exact; each object is a local
	// hit on exactly one node (its owner) and a peer hit on the others.
	hitsOn := make([]int, items)
	for _, n := range nodes {
		for i := range items {
			it, err := n.c.ItemByIndex(ctx, "ds", i)
			if err != nil {
				t.Fatalf("%s item %d: %v", n.name, i, err)
			}
			if string(it.Data) != string(files[it.Key]) {
				t.Fatalf("%s item %d (%s): wrong bytes", n.name, i, it.Key)
			}
			if it.Cache == "hit" {
				hitsOn[i]++
			}
		}
	}
	for i, h := range hitsOn {
		if h != 1 {
			t.Fatalf("item %d is held by %d nodes, want exactly 1", i, h)
		}
	}
	if s := sumStats(t, nodes); s.SourceReads != items {
		t.Fatalf("%d S3 reads after reading everything from every node, want %d", s.SourceReads, items)
	}

	// cachectl analyze on an S3 dataset: its cold rate is S3's own, measured
	// with reads that bypass the cache (each one a GET, nothing admitted).
	out, err := exec.Command(filepath.Join(binDir, "cachectl"), "--node", "http://"+nodes[0].http, "--json",
		"analyze", "ds", "--sample", "40").CombinedOutput()
	var an analyzeOutput
	if err != nil || json.Unmarshal(out, &an) != nil || an.Model.Rates.Cold <= 0 || an.Model.Rates.Cached <= 0 {
		t.Fatalf("cachectl analyze on S3: %v\n%s", err, out)
	}
	if s := sumStats(t, nodes); s.SourceReads < items+40 || s.ItemsCached != items {
		t.Fatalf("analyze made %d S3 reads (want at least the 40 cold samples) and left %d items cached (want %d)",
			s.SourceReads-items, s.ItemsCached, items)
	}

	// Storage errors at registration: nothing is registered.
	if _, err := nodes[1].c.PutDataset(ctx, "nobucket", "s3://no-such-bucket/x"); apiStatus(err) != http.StatusNotFound {
		t.Errorf("missing bucket: %v, want 404", err)
	}
	wrong := startNode(t, nodeOpts{name: "w1", bootstrap: true, extra: []string{"--s3-endpoint", srv.Endpoint},
		env: []string{"AWS_ACCESS_KEY_ID=" + miniotest.User, "AWS_SECRET_ACCESS_KEY=not-the-secret"}})
	waitReady(t, wrong)
	_, err = wrong.c.PutDataset(ctx, "ds", "s3://train/imagenet/train")
	if apiStatus(err) != http.StatusForbidden {
		t.Errorf("wrong credentials: %v, want 403", err)
	}
	if err != nil && strings.Contains(err.Error(), "not-the-secret") {
		t.Errorf("the secret in an error: %v", err)
	}
	if ds, err := wrong.c.Datasets(ctx); err != nil || len(ds) != 0 {
		t.Errorf("after a refused registration: %v %v, want no dataset", ds, err)
	}
	if ds, err := nodes[0].c.Datasets(ctx); err != nil || len(ds) != 1 { // ds only
		t.Errorf("after a refused registration: %v %v, want only ds", ds, err)
	}

	// An object overwritten after registration: 409 "source changed: KEY"
	// for that item (502 before v4), never the new bytes.
	if _, err := nodes[0].c.PutDataset(ctx, "small", "s3://train/small"); err != nil {
		t.Fatal(err)
	}
	srv.Put("train", map[string][]byte{"small/with space.jpg": []byte("replaced")})
	var overwritten int
	for i := range 20 {
		it, err := nodes[0].c.ItemByIndex(ctx, "small", i)
		if it.Key == "with space.jpg" || (err != nil && apiStatus(err) == http.StatusConflict) {
			overwritten++
			if apiStatus(err) != http.StatusConflict || !strings.Contains(err.Error(), "source changed: with space.jpg") {
				t.Fatalf("overwritten object: %q, %v; want 409 source changed: with space.jpg", it.Data, err)
			}
			continue
		}
		if err != nil || string(it.Data) != string(small[it.Key]) {
			t.Fatalf("small item %d: %v", i, err)
		}
	}
	if overwritten != 1 {
		t.Fatalf("%d items failed as overwritten, want 1", overwritten)
	}

	// MinIO stops: cached items are served; uncached ones fail with 502 or
	// 504 within the storage timeout, and are served once it is back.
	if _, err := nodes[0].c.PutDataset(ctx, "cold", "s3://train/small"); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if err := readAll(ctx, nodes[2], "ds", files, items, 3); err != nil {
		t.Fatalf("cached items with S3 down: %v", err)
	}
	const uncached = 5 // of "cold", never read
	start := time.Now()
	_, err = nodes[1].c.ItemByIndex(ctx, "cold", uncached)
	if st := apiStatus(err); st != http.StatusBadGateway && st != http.StatusGatewayTimeout {
		t.Fatalf("uncached item with S3 down: %v, want 502 or 504", err)
	}
	t.Logf("uncached item with S3 down: %v after %v", err, time.Since(start).Round(time.Millisecond))
	srv.Restart()
	testutil.AwaitWithin(t, 30*time.Second, "an uncached item once S3 is back", func() bool {
		it, err := nodes[1].c.ItemByIndex(ctx, "cold", uncached)
		return err == nil && string(it.Data) == string(small[it.Key])
	})
}
