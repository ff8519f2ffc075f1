package integration

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"stallfree/internal/testutil"
)

// writeSparse writes items empty-block files of 4 KiB under dir, 1000 a
// directory, with 4 writers.
func writeSparse(t *testing.T, dir string, items int) {
	t.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for w := range 4 {
		wg.Go(func() {
			for d := w; d*1000 < items; d += 4 {
				sub := filepath.Join(dir, fmt.Sprintf("n%08d", d))
				if err := os.MkdirAll(sub, 0o755); err != nil {
					errs <- err
					return
				}
				for i := d * 1000; i < min(items, (d+1)*1000); i++ {
					f, err := os.Create(filepath.Join(sub, fmt.Sprintf("n%08d_%d.JPEG", d, i)))
					if err == nil {
						err = f.Truncate(4 << 10)
						f.Close()
					}
					if err != nil {
						errs <- err
						return
					}
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
}

// vmRSS is a process's resident set in bytes.
func vmRSS(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS for pid %d", pid)
	return 0
}

// After a large registration, leader and follower hand what it used back to
// the OS within 10 s, without any debug call: the RSS they keep is the
// manifest's (~20-30 B an item), not the listing's and the decoded chunks'
// (~280 B an item on the leader, ~100 on a follower before, at 2 M items).
func TestRegistrationMemoryIsReturned(t *testing.T) {
	testutil.Long(t)
	const items = 400_000
	const limit = 64 // bytes of RSS per item, the goal
	dir := t.TempDir()
	writeSparse(t, dir, items)
	nodes := []*proc{startNode(t, nodeOpts{name: "n1", bootstrap: true, plain: true})}
	nodes = append(nodes, startNode(t, nodeOpts{name: "n2", join: []string{nodes[0].gossip}, plain: true}))
	waitMembers(t, nodes, names(nodes))
	before := make([]int64, len(nodes))
	for i, n := range nodes {
		before[i] = vmRSS(t, n.cmd.Process.Pid)
	}
	register(t, nodes[0], "big", dir)
	registered := time.Now()
	perItem := func(i int) float64 {
		return float64(vmRSS(t, nodes[i].cmd.Process.Pid)-before[i]) / items
	}
	testutil.AwaitWithin(t, 10*time.Second, "the follower's catalog", func() bool {
		d, err := nodes[1].c.Dataset(context.Background(), "big")
		return err == nil && d.Items == items
	})
	first := []float64{perItem(0), perItem(1)}
	ok := testutil.Within(10*time.Second-time.Since(registered), func() bool { return perItem(0) <= limit && perItem(1) <= limit })
	t.Logf("RSS per item: leader %.0f B, follower %.0f B at first; %.0f B and %.0f B %.1f s after the registration",
		first[0], first[1], perItem(0), perItem(1), time.Since(registered).Seconds())
	if !ok {
		t.Fatalf("RSS per item still leader %.0f B, follower %.0f B 10 s after registering %d items (goal <= %d)",
			perItem(0), perItem(1), items, limit)
	}
}
