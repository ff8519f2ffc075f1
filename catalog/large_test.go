package catalog

import (
	"bytes"
	"fmt"
	"io"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/vmihailenco/msgpack/v5"

	"stallfree/source"
)

// A commit of a registration of at least largeRegistration items tells the
// node (onLarge: it returns the registration's memory to the OS), once;
// a smaller one, and the begin and chunk commands, do not. A restore of a
// snapshot holding that many items tells it too; one holding fewer does not.
func TestLargeRegistrationsAreReported(t *testing.T) {
	large := 0
	f := &fsm{st: newState(), onLarge: func() { large++ }}
	apply := func(index uint64, c *command) any {
		t.Helper()
		b, err := msgpack.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		return f.Apply(&raft.Log{Index: index, Data: b})
	}
	register := func(index uint64, name string, n int) {
		t.Helper()
		entries := make([]source.Entry, n)
		for i := range entries {
			entries[i] = source.Entry{Key: fmt.Sprintf("k%07d", i), Size: 1}
		}
		before := large
		apply(index, &command{Op: opBegin, Name: name, Source: "/" + name, Token: "t", Count: n})
		apply(index+1, &command{Op: opChunk, Name: name, Token: "t", Chunk: NewManifest(entries)})
		if large != before {
			t.Fatalf("%s: begin and chunk reported %d times", name, large-before)
		}
		if _, ok := apply(index+2, &command{Op: opCommit, Name: name, Token: "t"}).(*Dataset); !ok {
			t.Fatalf("%s: commit failed", name)
		}
	}
	snapshot := func() []byte {
		t.Helper()
		snap, err := f.Snapshot()
		if err != nil {
			t.Fatal(err)
		}
		sink := &memSink{}
		if err := snap.Persist(sink); err != nil {
			t.Fatal(err)
		}
		return sink.Bytes()
	}
	restored := func(b []byte) int {
		t.Helper()
		n := 0
		g := &fsm{st: newState(), onLarge: func() { n++ }}
		if err := g.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
			t.Fatal(err)
		}
		return n
	}

	register(1, "small", largeRegistration-1)
	if large != 0 {
		t.Fatalf("%d items reported as large", largeRegistration-1)
	}
	if n := restored(snapshot()); n != 0 {
		t.Fatalf("a restore of %d items reported %d times", largeRegistration-1, n)
	}
	register(5, "one", 1)
	if large != 0 {
		t.Fatal("a registration of one item reported as large")
	}
	if n := restored(snapshot()); n != 1 {
		t.Fatalf("a restore of exactly %d items in two datasets reported %d times, want once", largeRegistration, n)
	}
	register(10, "big", largeRegistration)
	if large != 1 {
		t.Fatalf("a registration of exactly %d items reported %d times, want once", largeRegistration, large)
	}
	// Without anyone to tell, nothing is called.
	f.onLarge = nil
	register(20, "big2", largeRegistration)
	g := &fsm{st: newState()}
	if err := g.Restore(io.NopCloser(bytes.NewReader(snapshot()))); err != nil {
		t.Fatal(err)
	}
}

// A group's epoch has ceil(samples / batch) batches: the last may be short.
func TestGroupBatches(t *testing.T) {
	for _, c := range []struct{ samples, batch, want int }{{10, 3, 4}, {9, 3, 3}, {1, 5, 1}, {5, 5, 1}, {6, 5, 2}} {
		if got := (&Group{Samples: c.samples, BatchSize: c.batch}).Batches(); got != c.want {
			t.Errorf("%d samples in batches of %d: %d batches, want %d", c.samples, c.batch, got, c.want)
		}
	}
}
