package cluster

import (
	"context"
	"sync"
	"testing"
	"time"

	"stallfree/catalog"
	"stallfree/source"
	"stallfree/transport"
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

// A peer that applied a dataset's new registration a moment before this
// node asks for it at its new version: the request waits for this node's
// catalog to catch up, then is answered, instead of being refused for a
// version this node does not have yet.
//
// The version is the raft index of the registration's commit, so the test
// learns how many entries a deletion and a registration take, asks for the
// index the next ones will reach, and then makes them. Should anything else
// reach raft between, it tries again.
func TestServePeerWaitsForTheCatalogToCatchUp(t *testing.T) {
	c, d, _, local := oneMember(t, 4, 100)
	entries := make([]source.Entry, d.Manifest.Len())
	for i := range entries {
		entries[i] = source.Entry{Key: d.Manifest.Key(i), Size: d.Manifest.Size(i)}
	}
	reregister := func() *catalog.Dataset {
		t.Helper()
		if err := c.cat.DeleteDataset(d.Name); err != nil {
			t.Fatal(err)
		}
		nd, _, err := c.cat.RegisterDataset(d.Name, d.Source, entries, 0)
		if err != nil {
			t.Fatal(err)
		}
		return nd
	}
	// The leader's first miss in a term writes a raft barrier (catalog's
	// settleAsLeader); the waiting request misses while the dataset is
	// deleted, so that barrier is spent first.
	if _, ok := c.cat.Dataset("absent"); ok {
		t.Fatal("a dataset never registered is found")
	}
	d = reregister() // from the last index on
	for attempt := 0; ; attempt++ {
		before := d.Version
		d = reregister()
		had, next := d.Version, d.Version+(d.Version-before)
		type answer struct {
			items []transport.Item
			err   error
		}
		asked, answered := make(chan struct{}), make(chan answer, 1)
		go func() {
			close(asked)
			items, err := c.servePeer(context.Background(), &transport.Request{Dataset: d.Name, DatasetVersion: next, Indices: []uint32{0, 1, 2, 3}})
			answered <- answer{items, err}
		}()
		<-asked
		d = reregister()
		a := <-answered
		if d.Version != next {
			t.Logf("attempt %d: version %d, predicted %d", attempt, d.Version, next)
			if attempt == 3 {
				t.Fatalf("the registration reached version %d, not %d, four times", d.Version, next)
			}
			continue
		}
		if a.err != nil {
			t.Fatalf("a request for version %d while this node had %d: %v", next, had, a.err)
		}
		for i, it := range a.items {
			if !it.Found || string(it.Data) != string(local.items[i]) {
				t.Fatalf("item %d: found %v, %q", i, it.Found, it.Data)
			}
		}
		return
	}
}
