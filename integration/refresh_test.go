package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"stallfree/internal/testutil"
)

// Issue 47, on two real nodes: a file rewritten in place (same size, later
// mtime) after its item was cached is found by the next warm-up, which drops
// the held bytes and names the item; reads of it answer 409 {"error":
// "source changed: KEY"} on every node; `cachectl datasets refresh` through
// the follower (relayed to the leader) makes a new version that serves the
// new bytes everywhere, and a second refresh finds nothing changed.
func TestChangedFileIsRefusedUntilRefreshed(t *testing.T) {
	testutil.Long(t)
	dir, files := dataset(t, 12, 500)
	nodes := startCluster(t, clusterOpts{nodes: 2})
	register(t, nodes[0], "ds", dir)
	ctx := context.Background()
	for _, n := range nodes {
		if err := readAll(ctx, n, "ds", files, len(files), 1); err != nil {
			t.Fatal(err)
		}
	}
	var key string
	for k := range files {
		key = k
		break
	}
	path := filepath.Join(dir, filepath.FromSlash(key))
	fresh := []byte(strings.Repeat("n", len(files[key])))
	if err := os.WriteFile(path, fresh, 0o644); err != nil {
		t.Fatal(err)
	}
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	cachectl := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(binDir, "cachectl"), append([]string{"--node", "http://" + nodes[1].http}, args...)...).CombinedOutput()
		return string(out), err
	}
	out, err := cachectl("warmup", "ds")
	if err == nil || !strings.Contains(out, "source changed: "+key) || !strings.Contains(out, "cachectl datasets refresh ds") {
		t.Fatalf("warm-up over a changed cached file: %v\n%s", err, out)
	}
	for _, n := range nodes {
		code, body := getRaw(t, n, "/v1/datasets/ds/items/"+key)
		if code != 409 || string(body) != `{"error":"source changed: `+key+`"}` {
			t.Fatalf("%s: read of the changed item: %d %s", n.name, code, body)
		}
	}
	if out, err := cachectl("datasets", "refresh", "ds"); err != nil || !strings.Contains(out, "refreshed as version") {
		t.Fatalf("datasets refresh through the follower: %v\n%s", err, out)
	}
	for _, n := range nodes {
		testutil.AwaitWithin(t, 10*time.Second, n.name+" to serve the new bytes", func() bool {
			code, body := getRaw(t, n, "/v1/datasets/ds/items/"+key)
			return code == 200 && string(body) == string(fresh)
		})
	}
	if out, err := cachectl("datasets", "refresh", "ds"); err != nil || !strings.Contains(out, "unchanged") {
		t.Fatalf("a second refresh: %v\n%s", err, out)
	}
}
