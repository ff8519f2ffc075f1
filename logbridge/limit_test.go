package logbridge

import (
	"bytes"
	"fmt"
	"log/slog"
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
// limited; the rest, a peer lost or a send that failed, all come through.
func TestMemberlistRemoteLinesAreLimited(t *testing.T) {
	var buf bytes.Buffer
	clock := time.Unix(1000, 0)
	w := &memberlistWriter{log: slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})), remote: NewLimiter(RefusalsEvery)}
	w.remote.now = func() time.Time { return clock }
	for i := range 100 {
		fmt.Fprintf(w, "[ERR] memberlist: failed to receive: payload is too small to decrypt: 1 from=127.0.0.1:%d\n", i)
		fmt.Fprintf(w, "[DEBUG] memberlist: Stream connection from=127.0.0.1:%d\n", i)
	}
	fmt.Fprintln(w, "[ERR] memberlist: Failed to send gossip to 127.0.0.1:9: boom")
	fmt.Fprintln(w, "[INFO] memberlist: Marking n3 as failed, suspect timeout reached (1 peer confirmations)")
	clock = clock.Add(RefusalsEvery)
	fmt.Fprintln(w, "[WARN] memberlist: Got invalid checksum for UDP packet from=127.0.0.1:7")
	lines := jsonLines(t, &buf)
	var remote, debug, other int
	for _, l := range lines {
		switch l["level"] {
		case "DEBUG":
			debug++
		case "ERROR", "WARN":
			if bytes.Contains([]byte(l["msg"].(string)), []byte("from=")) {
				remote++
			} else {
				other++
			}
		}
	}
	if remote != 2 || debug != 100 || other != 2 {
		t.Fatalf("%d remote, %d debug, %d other lines; want 2, 100, 2: %s", remote, debug, other, buf.String())
	}
	if last := lines[len(lines)-1]; last["left_out"] != float64(99) {
		t.Fatalf("the line after the interval: %v; want left_out 99", last)
	}
}
