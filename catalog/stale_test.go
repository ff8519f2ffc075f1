package catalog

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"stallfree/internal/testutil"
)

// syncBuf is a log sink safe for raft's goroutines.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// --bootstrap on a directory with an earlier run's raft state: the node that
// formed that cluster resumes it and says so in one line; a node that is not
// one of its members is refused with the directory and the way out, never
// silently mixed in.
func TestBootstrapOnStaleStateResumesOrRefuses(t *testing.T) {
	dir := t.TempDir()
	first := openLeader(t, dir, testutil.FreeAddr(t))
	if _, _, err := first.RegisterDataset("old", "/data/old", entries(3), 0); err != nil {
		t.Fatal(err)
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}

	_, err := Open(Config{Key: testutil.ClusterKey(), NodeID: "other", Bind: testutil.FreeAddr(t), Dir: dir, Bootstrap: true, Timing: LocalTiming(), Logger: slog.New(slog.DiscardHandler)})
	if err == nil {
		t.Fatal("a node that is not a member bootstrapped on another cluster's raft state")
	}
	for _, want := range []string{dir, "not a member", "members: [n1]", "rm -r " + dir} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}

	var logs syncBuf
	c, err := Open(Config{Key: testutil.ClusterKey(), NodeID: "n1", Bind: testutil.FreeAddr(t), Dir: dir, Bootstrap: true, Timing: LocalTiming(),
		Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatalf("resuming its own cluster: %v", err)
	}
	defer c.Close()
	if n := strings.Count(logs.String(), "resuming the cluster recorded in --data-dir"); n != 1 {
		t.Errorf("%d resume lines, want 1; log:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "data_dir="+dir) {
		t.Errorf("the resume line does not name the directory:\n%s", logs.String())
	}
	if !c.WaitFor(t.Context(), func() bool { _, ok := c.Dataset("old"); return ok }) {
		t.Fatal("the resumed catalog lacks the earlier dataset")
	}
}
