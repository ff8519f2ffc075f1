// Package testcatalog starts the raft catalog tests of the packages above it
// decide on: one member, bootstrapped, leading, on loopback, closed at the
// test's end.
package testcatalog

import (
	"context"
	"testing"
	"time"

	"stallfree/catalog"
	"stallfree/internal/testutil"
)

// Leader is a one-member catalog, node id, that leads.
func Leader(t testing.TB, id string) *catalog.Catalog {
	t.Helper()
	cat, err := catalog.Open(catalog.Config{Key: testutil.ClusterKey(), NodeID: id, Bind: testutil.FreeAddr(t), Dir: t.TempDir(),
		Bootstrap: true, Timing: catalog.LocalTiming(), Logger: testutil.Discard()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cat.WaitLeader(ctx); err != nil {
		t.Fatal(err)
	}
	return cat
}
