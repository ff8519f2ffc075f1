package catalog

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"

	"stallfree/internal/testutil"
)

// countHandler counts the records at WARN and above.
type countHandler struct{ warned *atomic.Int64 }

func (h countHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h countHandler) WithAttrs([]slog.Attr) slog.Handler       { return h }
func (h countHandler) WithGroup(string) slog.Handler            { return h }
func (h countHandler) Handle(_ context.Context, r slog.Record) error {
	if r.Level >= slog.LevelWarn {
		h.warned.Add(1)
	}
	return nil
}

// Connections to the raft port without the cluster key, which anyone can
// open at will, are refused with one log line for many, not one each.
func TestRefusedRaftConnectionsLogOnceAnInterval(t *testing.T) {
	var warned atomic.Int64
	s, err := newAuthStream("127.0.0.1:0", nil, testutil.ClusterKey(), slog.New(countHandler{&warned}))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testutil.KnockWithoutKey(t, s.ln.Addr().String(), 20)
	if n := warned.Load(); n != 1 {
		t.Fatalf("20 refused connections logged %d warnings, want 1", n)
	}
}
