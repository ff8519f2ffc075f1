package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"stallfree/internal/testutil"
)

// A second cachenode on a live node's --data-dir exits within seconds naming
// the directory and the holder's pid; the first keeps serving; a lock left by
// a killed node does not block its restart.
func TestSecondNodeOnADataDirIsRefused(t *testing.T) {
	n1 := startNode(t, nodeOpts{name: "n1", bootstrap: true, plain: true})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "plain", "cachenode"), "--name", "n1b", "--bootstrap",
		"--data-dir", n1.dataDir, "--http", testutil.FreeAddrOn(t, "127.0.0.1"), "--peer", testutil.FreeAddrOn(t, "127.0.0.1"),
		"--gossip", testutil.FreeAddrOn(t, "127.0.0.1"), "--raft", testutil.FreeAddrOn(t, "127.0.0.1"), "--fast-timers")
	began := time.Now()
	out, err := cmd.CombinedOutput()
	if err == nil || ctx.Err() != nil {
		t.Fatalf("second node on %s: err %v after %v (want a prompt non-zero exit)\n%s", n1.dataDir, err, time.Since(began), out)
	}
	for _, want := range []string{n1.dataDir, fmt.Sprintf("pid %d", n1.cmd.Process.Pid)} {
		if !strings.Contains(string(out), want) {
			t.Errorf("its error does not name %q:\n%s", want, out)
		}
	}
	t.Logf("refused in %v: %s", time.Since(began).Round(time.Millisecond), strings.TrimSpace(string(out)))
	mustStats(t, n1)

	pid := n1.cmd.Process.Pid
	n1.kill()
	if b, _ := os.ReadFile(filepath.Join(n1.dataDir, "LOCK")); strings.TrimSpace(string(b)) != fmt.Sprint(pid) {
		t.Fatalf("LOCK holds %q, want the killed node's pid %d", b, pid)
	}
	n1.start() // fails the test unless it comes up
	mustStats(t, n1)
}

// A follower restarted behind the leader never lists a partial catalog: its
// catalog reads answer 503 with Retry-After and a JSON error until it has
// applied what the leader had, then the full list.
func TestRestartedFollowerListsNoPartialCatalog(t *testing.T) {
	testutil.Long(t)
	dir, _ := dataset(t, 20, 500)
	nodes := startCluster(t, clusterOpts{nodes: 3})
	register(t, nodes[0], "ds0", dir)
	cl := mustCluster(t, nodes[0])
	var follower, leader *proc
	for _, n := range nodes {
		switch {
		case n.name == cl.Leader:
			leader = n
		case follower == nil:
			follower = n
		}
	}
	follower.kill()
	want := []string{"ds0"}
	for i := 1; i <= 3; i++ {
		name := fmt.Sprintf("ds%d", i)
		register(t, leader, name, dir)
		want = append(want, name)
	}
	// Long enough for the leader's retries to the dead follower to back off
	// by seconds (the window this test is about).
	time.Sleep(3 * time.Second)
	follower.start()

	busy, partial := 0, 0
	testutil.AwaitWithin(t, 60*time.Second, follower.name+" listing every dataset", func() bool {
		resp, err := http.Get("http://" + follower.http + "/v1/datasets")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		switch resp.StatusCode {
		case http.StatusServiceUnavailable:
			var e struct{ Error string }
			if json.Unmarshal(body, &e) != nil || e.Error == "" || resp.Header.Get("Retry-After") == "" {
				t.Errorf("503 without a JSON error or Retry-After: %q %v", body, resp.Header)
			}
			busy++
			return false
		case http.StatusOK:
			var ds []struct{ Name string }
			if err := json.Unmarshal(body, &ds); err != nil {
				t.Fatalf("list: %v %q", err, body)
			}
			var got []string
			for _, d := range ds {
				got = append(got, d.Name)
			}
			slices.Sort(got)
			if !slices.Equal(got, want) {
				partial++
				t.Errorf("200 with a partial catalog %v, want %v", got, want)
				return false
			}
			return true
		default:
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		return false
	})
	t.Logf("%s answered 503 %d times before listing all %d datasets (0 partial lists)", follower.name, busy, len(want))
}

// logLine is one line of a node's log, in either format.
type logLine struct {
	at    time.Time
	level string
	text  string
}

// parseLog splits a node's log into lines; every line must be in the one
// format asked for (text: slog's key=value; json: one object per line).
func parseLog(t *testing.T, name, format, log string) []logLine {
	t.Helper()
	var out []logLine
	for line := range strings.SplitSeq(strings.TrimSpace(log), "\n") {
		var l logLine
		l.text = line
		switch format {
		case "json":
			var m map[string]any
			if err := json.Unmarshal([]byte(line), &m); err != nil {
				t.Errorf("%s: not a JSON line: %q", name, line)
				continue
			}
			ts, _ := m["time"].(string)
			l.at, _ = time.Parse(time.RFC3339Nano, ts)
			l.level, _ = m["level"].(string)
		default:
			rest, ok := strings.CutPrefix(line, "time=")
			ts, rest, _ := strings.Cut(rest, " ")
			lvl, ok2 := strings.CutPrefix(rest, "level=")
			if !ok || !ok2 {
				t.Errorf("%s: not a slog text line: %q", name, line)
				continue
			}
			l.at, _ = time.Parse(time.RFC3339Nano, ts)
			l.level, _, _ = strings.Cut(lvl, " ")
		}
		if l.at.IsZero() {
			t.Errorf("%s: no time in %q", name, line)
		}
		out = append(out, l)
	}
	return out
}

// A healthy three-node start (bootstrap, two joins, a dataset, a warm-up),
// with the timers as deployed, logs in one format and no WARN or ERROR line;
// a peer lost afterwards is still a WARN. cachectl's progress into a pipe is
// plain lines with a last line of count, bytes and time.
func TestHealthyStartLogsNoWarnings(t *testing.T) {
	dir, files := dataset(t, 200, 2000)
	formats := []string{"json", "text", "text"}
	n1 := startNode(t, nodeOpts{name: "n1", bootstrap: true, plain: true, defaultTimers: true, logLevel: "info",
		extra: []string{"--log-format", formats[0]}})
	nodes := []*proc{n1}
	for i := 2; i <= 3; i++ {
		nodes = append(nodes, startNode(t, nodeOpts{name: fmt.Sprintf("n%d", i), join: []string{n1.gossip}, plain: true,
			defaultTimers: true, logLevel: "info", extra: []string{"--log-format", formats[i-1]}}))
	}
	waitMembers(t, nodes, names(nodes))
	register(t, nodes[1], "ds", dir)
	out, err := exec.Command(filepath.Join(binDir, "cachectl"), "--node", "http://"+n1.http, "warmup", "ds").CombinedOutput()
	if err != nil {
		t.Fatalf("warmup: %v\n%s", err, out)
	}
	if strings.ContainsAny(string(out), "\r\x1b") {
		t.Errorf("cachectl warmup into a pipe wrote terminal control characters: %q", out)
	}
	if last := strings.TrimSpace(string(out)); !strings.Contains(last, fmt.Sprintf("warmed %d of %d items", len(files), len(files))) {
		t.Errorf("no last line with the count: %q", out)
	}
	testutil.AwaitWithin(t, 30*time.Second, "every node ready", func() bool {
		for _, n := range nodes {
			resp, err := http.Get("http://" + n.http + "/readyz")
			if err != nil {
				return false
			}
			resp.Body.Close()
			if resp.StatusCode != 200 {
				return false
			}
		}
		return true
	})
	healthy := time.Now()

	// Real trouble: a peer killed. The survivors must say so.
	nodes[2].kill()
	testutil.AwaitWithin(t, 60*time.Second, "n3 seen dead", func() bool {
		for _, m := range mustCluster(t, n1).Members {
			if m.Name == "n3" {
				return m.State != "alive"
			}
		}
		return true
	})
	n1.stop()
	nodes[1].stop()
	for i, n := range nodes {
		lines := parseLog(t, n.name, formats[i], n.log.String())
		if len(lines) == 0 {
			t.Errorf("%s logged nothing at info", n.name)
		}
		for _, l := range lines {
			if l.at.Before(healthy) && (l.level == "WARN" || l.level == "ERROR") {
				t.Errorf("%s, healthy start: %s", n.name, l.text)
			}
		}
	}
	lost := false
	for _, l := range parseLog(t, "n1", "json", n1.log.String()) {
		lost = lost || (l.at.After(healthy) && l.level == "WARN" && strings.Contains(l.text, "n3"))
	}
	if !lost {
		t.Errorf("n1 logged no WARN about losing n3:\n%s", n1.log.String())
	}
}
