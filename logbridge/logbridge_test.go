package logbridge

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

func jsonLines(t *testing.T, b *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for line := range strings.SplitSeq(strings.TrimSpace(b.String()), "\n") {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("not one JSON line: %q", line)
		}
		out = append(out, m)
	}
	return out
}

func TestRaftLinesComeThroughSlogWithMappedLevels(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	r := Raft(log)
	r.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "", "last-leader-id", "")
	r.Warn("appendEntries rejected, sending older logs", "peer", "n2", "next", 1)
	r.Warn("heartbeat timeout reached, starting election", "last-leader-addr", "127.0.0.1:1", "last-leader-id", "n1")
	r.Warn("failed to contact", "server-id", "n3", "time", 5e8)
	r.Error("failed to take snapshot", "error", "disk full")
	r.Debug("not shown at info")
	lines := jsonLines(t, &buf)
	if strings.Count(buf.String(), `"time":`) != len(lines) {
		t.Errorf("a field named time shadows the line's own:\n%s", buf.String())
	}
	want := []struct{ level, msg string }{
		{"INFO", "heartbeat timeout reached, starting election"}, // the first election: routine
		{"INFO", "appendEntries rejected, sending older logs"},   // a new follower catching up
		{"WARN", "heartbeat timeout reached, starting election"}, // a leader lost
		{"WARN", "failed to contact"},
		{"ERROR", "failed to take snapshot"},
	}
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d: %s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		if lines[i]["level"] != w.level || lines[i]["msg"] != w.msg || lines[i]["component"] != "raft" {
			t.Errorf("line %d: %v, want %s %q component=raft", i, lines[i], w.level, w.msg)
		}
	}
	if lines[3]["server-id"] != "n3" || lines[3]["raft-time"] != 5e8 || lines[4]["error"] != "disk full" {
		t.Errorf("fields lost: %v %v", lines[3], lines[4])
	}
	if _, ok := lines[0]["@timestamp"]; ok {
		t.Errorf("hclog's own timestamp kept: %v", lines[0])
	}
}

func TestRaftFollowsTheDebugLevel(t *testing.T) {
	var buf bytes.Buffer
	r := Raft(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	if !r.IsDebug() {
		t.Fatal("hclog not at debug under a debug slog handler")
	}
	r.Debug("shown at debug")
	if l := jsonLines(t, &buf); len(l) != 1 || l[0]["level"] != "DEBUG" {
		t.Fatalf("got %s", buf.String())
	}
	var _ hclog.Logger = r
}

func TestMemberlistLinesMapTheirBracketedLevel(t *testing.T) {
	var buf bytes.Buffer
	l := Memberlist(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	l.Printf("[DEBUG] memberlist: Stream connection from=127.0.0.1:5")
	l.Printf("[INFO] memberlist: Suspect n3 has failed, no acks received")
	l.Printf("[INFO] memberlist: Marking n3 as failed, suspect timeout reached (1 peer confirmations)")
	l.Printf("[WARN] memberlist: Refuting a suspect message (from: n2)")
	l.Printf("[ERR] memberlist: Failed to send gossip to 127.0.0.1:9: boom")
	want := []struct{ level, msg string }{
		{"DEBUG", "Stream connection from=127.0.0.1:5"},
		{"WARN", "Suspect n3 has failed, no acks received"}, // a peer lost
		{"WARN", "Marking n3 as failed, suspect timeout reached (1 peer confirmations)"},
		{"WARN", "Refuting a suspect message (from: n2)"},
		{"ERROR", "Failed to send gossip to 127.0.0.1:9: boom"},
	}
	lines := jsonLines(t, &buf)
	if len(lines) != len(want) {
		t.Fatalf("%d lines, want %d: %s", len(lines), len(want), buf.String())
	}
	for i, w := range want {
		if lines[i]["level"] != w.level || lines[i]["msg"] != w.msg || lines[i]["component"] != "memberlist" {
			t.Errorf("line %d: %v, want %s %q component=memberlist", i, lines[i], w.level, w.msg)
		}
	}
}
