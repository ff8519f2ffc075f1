package integration

import (
	"context"
	"errors"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"stallfree/internal/testutil"
)

// Issue 47: a --dataset whose source cannot be listed stops the node at
// start, exit status 1, with the reason naming the flag; before, the node
// ran on, logged one ERROR and never became ready.
func TestUnlistableDatasetFlagStopsTheNode(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "no-such-dir")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "cachenode"), "--name", "n1", "--data-dir", t.TempDir(),
		"--http", testutil.FreeAddrOn(t, "127.0.0.1"), "--peer", testutil.FreeAddrOn(t, "127.0.0.1"),
		"--gossip", testutil.FreeAddrOn(t, "127.0.0.1"), "--raft", testutil.FreeAddrOn(t, "127.0.0.1"),
		"--timing", "local", "--dataset", "imgs="+missing)
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("cachenode with an unlistable --dataset: %v (want exit status 1)\n%s", err, out)
	}
	want := "cachenode: --dataset imgs=" + missing + ": the source cannot be listed: source " + missing + ": "
	if !strings.Contains(string(out), want) || !strings.Contains(string(out), "no such file or directory") {
		t.Fatalf("output %q\nwant it to say %q and why", out, want)
	}
}
