// Package logbridge routes the logs of hashicorp/raft (hclog) and
// hashicorp/memberlist (a standard log.Logger) into the node's slog handler:
// one format, one level setting. It also maps their levels, so that what a
// healthy start always says (the first election, a new follower catching
// up) is INFO, while real trouble (a peer lost, a failed snapshot) stays
// WARN or ERROR. Lines a remote party can cause at will are kept to one
// per interval (Limiter).
package logbridge

import (
	"bytes"
	"context"
	"encoding/json"
	stdlog "log"
	"log/slog"
	"slices"
	"strings"
	"sync"

	"github.com/hashicorp/go-hclog"
)

// Raft returns the logger to give raft.Config.Logger: hclog writing JSON
// into a writer that re-emits every line through log, with component=raft.
func Raft(log *slog.Logger) hclog.Logger {
	log = log.With("component", "raft")
	level := hclog.Info
	if log.Enabled(context.Background(), slog.LevelDebug) {
		level = hclog.Debug
	}
	return hclog.New(&hclog.LoggerOptions{Name: "raft", Level: level, JSONFormat: true, Output: &hclogWriter{log: log}})
}

// raftRoutine are raft warnings every healthy start or join logs: a node's
// first election (no leader known yet), a node that has not been added to
// the configuration yet, and the leader bringing a new follower's empty log
// up to date. Raft logs them at WARN; here they are INFO.
var raftRoutine = []struct {
	msg  string
	when func(fields map[string]any) bool
}{
	{"heartbeat timeout reached, starting election", func(f map[string]any) bool { return f["last-leader-id"] == "" || f["last-leader-id"] == nil }},
	{"no known peers, aborting election", nil},
	{"not part of stable configuration, aborting election", nil},
	{"appendEntries rejected, sending older logs", nil},
	{"failed to get previous log", func(f map[string]any) bool { return f["error"] == "log not found" }},
}

type hclogWriter struct{ log *slog.Logger }

// Write takes one JSON line from hclog.
func (w *hclogWriter) Write(p []byte) (int, error) {
	for line := range bytes.SplitSeq(bytes.TrimSpace(p), []byte("\n")) {
		w.line(line)
	}
	return len(p), nil
}

func (w *hclogWriter) line(line []byte) {
	var fields map[string]any
	if err := json.Unmarshal(line, &fields); err != nil {
		w.log.Warn(string(line)) // not JSON: keep it, never drop a line
		return
	}
	msg, _ := fields["@message"].(string)
	lvl, _ := fields["@level"].(string)
	level := hclogLevel(lvl)
	for k := range fields {
		if strings.HasPrefix(k, "@") {
			delete(fields, k)
		}
	}
	if level == slog.LevelWarn {
		for _, r := range raftRoutine {
			if msg == r.msg && (r.when == nil || r.when(fields)) {
				level = slog.LevelInfo
			}
		}
	}
	if !w.log.Enabled(context.Background(), level) {
		return
	}
	keys := make([]string, 0, len(fields))
	for k := range fields {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	args := make([]any, 0, 2*len(keys))
	for _, k := range keys {
		name := k
		switch k {
		case slog.TimeKey, slog.LevelKey, slog.MessageKey, slog.SourceKey:
			// raft's own "time" (a duration) must not shadow the line's.
			name = "raft-" + k
		}
		args = append(args, name, fields[k])
	}
	w.log.Log(context.Background(), level, msg, args...)
}

func hclogLevel(s string) slog.Level {
	switch s {
	case "trace", "debug":
		return slog.LevelDebug
	case "info":
		return slog.LevelInfo
	case "warn":
		return slog.LevelWarn
	default: // error, and anything unknown
		return slog.LevelError
	}
}

// Memberlist returns the logger to give memberlist.Config.Logger. Its lines
// look like "[WARN] memberlist: text"; the bracketed level becomes the slog
// level. Memberlist logs a member it has declared failed at INFO; that is a
// peer lost, so it is WARN here.
// A WARN or ERROR line about something a remote sent (memberlist names it
// "from=ADDR": a packet that does not decrypt, a stream that is no gossip)
// is written at most once per RefusalsEvery for its kind (the text before
// its first colon), with the count of those left out: anyone who reaches the
// gossip port can cause one at will, and a flood of one kind must not hide a
// rarer one (a failed push/pull merge).
func Memberlist(log *slog.Logger) *stdlog.Logger {
	return stdlog.New(&memberlistWriter{log: log.With("component", "memberlist"), remote: map[string]*Limiter{}}, "", 0)
}

type memberlistWriter struct {
	log    *slog.Logger
	mu     sync.Mutex
	remote map[string]*Limiter // by kind, at most maxKinds; the rest share ""
}

// maxKinds bounds the limiters kept: a kind's text can carry what a remote
// sent (a node's name), so past this many, new kinds share one.
const maxKinds = 32

func (w *memberlistWriter) limiter(msg string) *Limiter {
	kind, _, _ := strings.Cut(msg, ":")
	w.mu.Lock()
	defer w.mu.Unlock()
	l := w.remote[kind]
	if l == nil {
		if len(w.remote) >= maxKinds {
			kind = ""
		}
		if l = w.remote[kind]; l == nil {
			l = NewLimiter(RefusalsEvery)
			w.remote[kind] = l
		}
	}
	return l
}

func (w *memberlistWriter) Write(p []byte) (int, error) {
	for line := range strings.SplitSeq(strings.TrimSpace(string(p)), "\n") {
		level, msg := memberlistLine(line)
		if level >= slog.LevelWarn && strings.Contains(msg, "from=") {
			ok, leftOut := w.limiter(msg).Allow()
			if !ok {
				continue
			}
			if leftOut > 0 {
				w.log.Log(context.Background(), level, msg, "left_out", leftOut)
				continue
			}
		}
		w.log.Log(context.Background(), level, msg)
	}
	return len(p), nil
}

func memberlistLine(line string) (slog.Level, string) {
	level := slog.LevelInfo
	if rest, ok := strings.CutPrefix(line, "["); ok {
		if tag, msg, ok := strings.Cut(rest, "] "); ok {
			line = msg
			switch tag {
			case "DEBUG", "TRACE":
				level = slog.LevelDebug
			case "INFO":
				level = slog.LevelInfo
			case "WARN":
				level = slog.LevelWarn
			default: // ERR, ERROR
				level = slog.LevelError
			}
		}
	}
	line = strings.TrimPrefix(line, "memberlist: ")
	if level < slog.LevelWarn && (strings.HasPrefix(line, "Marking ") && strings.Contains(line, " as failed, suspect timeout reached") ||
		strings.HasPrefix(line, "Suspect ") && strings.HasSuffix(line, " has failed, no acks received")) {
		level = slog.LevelWarn
	}
	return level, line
}
