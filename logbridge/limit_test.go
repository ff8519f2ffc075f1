package logbridge

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLimiterLetsOneLineThroughAnInterval(t *testing.T) {
	clock := time.Unix(1000, 0)
	l := NewLimiter(10 * time.Second)
	l.now = func() time.Time { return clock }
	if ok, n := l.Allow(); !ok || n != 0 {
		t.Fatalf("the first line: %v, %d left out", ok, n)
	}
	for range 5 {
		clock = clock.Add(time.Second)
		if ok, _ := l.Allow(); ok {
			t.Fatal("a second line within the interval")
		}
	}
	clock = clock.Add(5 * time.Second) // 10 s after the first
	if ok, n := l.Allow(); !ok || n != 5 {
		t.Fatalf("the line after the interval: %v, %d left out (want 5)", ok, n)
	}
	if ok, _ := l.Allow(); ok {
		t.Fatal("the interval starts again at the line written")
	}
}

// Memberlist lines about what a remote sent (WARN or ERROR, "from=") are
// limited, each kind (the text before its first colon) on its own, so a
// flood of one kind does not hide another; the rest, a peer lost or a send
// that failed, all come through. Kinds a remote can vary (a node's name in
// the text) share one limiter past maxKinds.
func TestMemberlistRemoteLinesAreLimited(t *testing.T) {
	var buf bytes.Buffer
	clock := time.Unix(1000, 0)
	w := &memberlistWriter{log: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), remote: map[string]*Limiter{}}
	now := func() time.Time { return clock }
	w.remote["failed to receive"] = &Limiter{every: RefusalsEvery, now: now}
	for i := range 100 {
		fmt.Fprintf(w, "[ERR] memberlist: failed to receive: payload is too small to decrypt: 1 from=127.0.0.1:%d\n", i)
		fmt.Fprintf(w, "[DEBUG] memberlist: Stream connection from=127.0.0.1:%d\n", i)
	}
	fmt.Fprintln(w, "[ERR] memberlist: Failed push/pull merge: boom from=127.0.0.2:7")
	fmt.Fprintln(w, "[ERR] memberlist: Failed to send gossip to 127.0.0.1:9: boom")
	fmt.Fprintln(w, "[INFO] memberlist: Marking n3 as failed, suspect timeout reached (1 peer confirmations)")
	clock = clock.Add(RefusalsEvery)
	fmt.Fprintln(w, "[ERR] memberlist: failed to receive: again from=127.0.0.1:7")
	lines := jsonLines(t, &buf)
	count := func(level, part string) int {
		n := 0
		for _, l := range lines {
			if l["level"] == level && strings.Contains(l["msg"].(string), part) {
				n++
			}
		}
		return n
	}
	if got := [4]int{count("ERROR", "failed to receive"), count("ERROR", "push/pull"), count("DEBUG", "Stream"), count("ERROR", "send gossip")}; got != [4]int{2, 1, 100, 1} {
		t.Fatalf("lines: %v failed to receive, push/pull, debug, send gossip; want [2 1 100 1]: %s", got, buf.String())
	}
	if last := lines[len(lines)-1]; last["left_out"] != float64(99) {
		t.Fatalf("the line after the interval: %v; want left_out 99", last)
	}

	buf.Reset()
	for i := range 3 * maxKinds { // a kind a remote varies: at most maxKinds+1 limiters, as many lines
		fmt.Fprintf(w, "[WARN] memberlist: Got ping for unexpected node 'n%d' from=127.0.0.1:5\n", i)
	}
	if n := len(jsonLines(t, &buf)); n > maxKinds+1 || len(w.remote) > maxKinds+1 {
		t.Fatalf("%d lines and %d limiters for %d kinds; want at most %d", n, len(w.remote), 3*maxKinds, maxKinds+1)
	}
}
