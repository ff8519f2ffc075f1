package derived

import (
	"context"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/internal/testutil"
	"stallfree/relay"
)

// With no logger given, the prep cache logs to slog's default: a member
// that does not answer a count is logged, not a crash.
func TestNoLoggerGiven(t *testing.T) {
	f := newFixture(t, 1<<20)
	d := f.derive(t)
	p := New(Config{Name: "self", Relay: relay.New("self", "")}, f.cat, f.st, f.host)
	if p.cfg.Logger == nil {
		t.Fatal("no logger")
	}
	f.host.members = []string{"self", "gone"}
	f.host.addrs["gone"] = testutil.FreeAddr(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	infos := []api.Dataset{Info(d)}
	p.Count(ctx, infos)
	if w := infos[0].Written; w == nil || *w != 0 {
		t.Fatalf("written %v", w)
	}
}
