package cluster

import (
	"context"
	"sync"
	"testing"
	"time"
)

// A batch from an owner is allowed PeerTimeout plus 50 ms per item, since
// the owner may have to read each from storage: a batch whose owner takes
// three times PeerTimeout over its first read still arrives whole, byte for
// byte, where a lone item would have been given up on.
func TestBatchDeadlineGrowsWithTheBatch(t *testing.T) {
	const peerTimeout = 100 * time.Millisecond
	a, join, d := startPair(t, 128, 10, "")
	var once sync.Once
	a.local.slow = func(int) { once.Do(func() { time.Sleep(3 * peerTimeout) }) }
	b := join("c2", func(c *Config) { c.PeerTimeout = peerTimeout })
	ofA := ownedBy(b.c, d, "c1")
	if len(ofA) < 20 {
		t.Fatalf("c1 owns %d of 128 items: pick another item count", len(ofA))
	}
	got, found := b.c.FromOwners(context.Background(), d, ofA)
	for j, i := range ofA {
		if !found[j] || string(got[j].Data) != string(a.local.items[i]) {
			t.Fatalf("item %d of the batch (%d items, the owner's first read taking %v): found %v", i, len(ofA), 3*peerTimeout, found[j])
		}
	}
	if f := b.c.Stats().PeerFailures; f != 0 {
		t.Fatalf("%d peer failures", f)
	}
}
