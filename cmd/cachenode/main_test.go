package main

import (
	"errors"
	"flag"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// Bad flags stop cachenode before it creates, binds or joins anything.
func TestBadFlagsFailBeforeStarting(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	base := []string{"--bootstrap", "--data-dir", dir, "--http", "127.0.0.1:0", "--peer", "127.0.0.1:0",
		"--gossip", "127.0.0.1:0", "--raft", "127.0.0.1:0"}
	// A --dataset whose source cannot be listed (issue 47): missing, a file,
	// a bad S3 endpoint.
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "missing")
	for _, c := range []struct{ args, want string }{
		{"--dataset imgs=" + missing, "--dataset imgs=" + missing + ": the source cannot be listed: source " + missing + ": "},
		{"--dataset imgs=dir://" + file, "--dataset imgs=dir://" + file + ": the source cannot be listed: source " + file + ": "},
		{"--dataset a=s3://bucket/p --s3-endpoint ftp://x", "--dataset a=s3://bucket/p: the source cannot be listed: --s3-endpoint"},
		{"--memory foo", `--memory "foo": want a size of at least 1MiB`},
		{"--memory 0", `--memory "0": want a size of at least 1MiB`},
		{"--memory 10", `--memory "10": want a size of at least 1MiB, such as 512MiB or 4GiB`},
		{"--send-buffer 2GiB", `--send-buffer "2GiB": want a size up to 1GiB`},
		{"--send-buffer -1", `--send-buffer "-1"`},
		{"--source-rate fast", `--source-rate "fast": want bytes per second`},
		{"--peer-timeout 0s", "--peer-timeout 0s: want a positive duration"},
		{"--peer-timeout -1s", "--peer-timeout -1s: want a positive duration"},
		{"--dataset noequals", `--dataset "noequals": want NAME=SOURCE`},
		{"--dataset =/data", `--dataset "=/data": want NAME=SOURCE`},
		{"--name=", "--name: a node needs a name"},
		{"--log-level loud", "--log-level"},
		{"--log-format xml", `--log-format "xml": want text or json`},
		{"--storage-timeout 0s", "--storage-timeout 0s: want a positive duration"},
		{"--group-timeout 0s", "--group-timeout 0s: want a positive duration"},
		{"--max-item-bytes 2GiB", `--max-item-bytes "2GiB": want a size up to 1GiB`},
		{"--timing wan", `--timing: timing "wan": want lan or local`},
		{"--max-inflight-bytes 12", `--max-inflight-bytes "12": want a size of at least 1MiB`},
		{"--max-body-bytes 12", `--max-body-bytes "12": want a size of at least 1MiB`},
		{"--gossip 0.0.0.0:0", "--gossip 0.0.0.0:0: binding gossip, peer or raft beyond loopback needs --cluster-key-file"},
		{"--peer 0.0.0.0:0", "--peer 0.0.0.0:0: binding gossip, peer or raft beyond loopback needs --cluster-key-file"},
		{"--raft 0.0.0.0:0", "--raft 0.0.0.0:0: binding gossip, peer or raft beyond loopback needs --cluster-key-file"},
	} {
		err := run(append(base, strings.Fields(c.args)...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one saying %q", c.args, err, c.want)
		}
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused flags left %s behind (stat: %v)", dir, err)
	}
	if err := run([]string{"-h"}); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("-h: err %v, want flag.ErrHelp (main exits 0)", err)
	}
}

// The hook that moves the memory limit runs after every collection, not
// once: each run re-arms it.
func TestAfterEachGCRunsAfterEveryCollection(t *testing.T) {
	ran := make(chan struct{}, 1)
	afterEachGC(func() {
		select {
		case ran <- struct{}{}:
		default:
		}
	})
	for round := range 3 {
		runtime.GC()
		select {
		case <-ran:
		case <-time.After(10 * time.Second):
			t.Fatalf("collection %d: the hook did not run", round+1)
		}
	}
}
