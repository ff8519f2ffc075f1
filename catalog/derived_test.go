package catalog

import (
	"bytes"
	"errors"
	"io"
	"testing"

	"github.com/hashicorp/raft"

	"stallfree/source"
)

// committed puts a committed dataset of n keys under name.
func committed(t *testing.T, f *fsm, index uint64, name string, n int) {
	t.Helper()
	var entries []source.Entry
	for i := range n {
		entries = append(entries, source.Entry{Key: string(rune('a'+i%26)) + string(rune('a'+i/26)), Size: int64(i + 1)})
	}
	f.apply(index, &command{Op: opBegin, Name: name, Source: "/" + name, Token: "t", Count: n})
	f.apply(index+1, &command{Op: opChunk, Name: name, Token: "t", Chunk: NewManifest(entries)})
	if _, ok := f.apply(index+2, &command{Op: opCommit, Name: name, Token: "t"}).(*Dataset); !ok {
		t.Fatal("commit failed")
	}
}

// A derived dataset shares its parent's manifest, is idempotent for the same
// body, conflicts otherwise, needs its parent, goes with it, and comes back
// from a snapshot linked to the parent's manifest (not a copy).
func TestDeriveRules(t *testing.T) {
	f := &fsm{st: newState()}
	committed(t, f, 1, "raw", 30)
	d, ok := f.apply(10, &command{Op: opDerive, Name: "dec", Parent: "raw", Stage: "s1"}).(*Dataset)
	if !ok || !d.Derived() || d.Manifest != f.st.Datasets["raw"].Manifest || d.Version != 10 {
		t.Fatalf("derive: %+v", d)
	}
	if r, ok := f.apply(11, &command{Op: opDerive, Name: "dec", Parent: "raw", Stage: "s1"}).(beginResult); !ok || r.existing != d {
		t.Fatalf("the same body again: %v", r)
	}
	for _, c := range []*command{
		{Op: opDerive, Name: "dec", Parent: "raw", Stage: "s2"},
		{Op: opDerive, Name: "raw", Parent: "dec", Stage: "s1"},
		{Op: opDerive, Name: "dec2", Parent: "dec", Stage: "s1"},
	} {
		if err, _ := f.apply(12, c).(error); !errors.Is(err, ErrConflict) {
			t.Fatalf("%+v: %v, want a conflict", c, err)
		}
	}
	if err, _ := f.apply(12, &command{Op: opDerive, Name: "x", Parent: "nope", Stage: "s"}).(error); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing parent: %v", err)
	}
	if err, _ := f.apply(12, &command{Op: opBegin, Name: "dec", Source: "/dec", Token: "u", Count: 1}).(error); !errors.Is(err, ErrConflict) {
		t.Fatalf("registering over a derived name: %v", err)
	}

	snap, err := f.Snapshot()
	if err != nil {
		t.Fatal(err)
	}
	sink := &memSink{}
	if err := snap.Persist(sink); err != nil {
		t.Fatal(err)
	}
	g := &fsm{st: newState()}
	if err := g.Restore(io.NopCloser(bytes.NewReader(sink.Bytes()))); err != nil {
		t.Fatal(err)
	}
	rd, rp := g.st.Datasets["dec"], g.st.Datasets["raw"]
	if rd == nil || rd.Manifest != rp.Manifest || rd.Stage != "s1" || rd.DerivedFrom != "raw" || rd.Manifest.Len() != 30 {
		t.Fatalf("restored: %+v", rd)
	}
	if f.st.Datasets["dec"].Manifest == nil {
		t.Fatal("the snapshot took the live entry's manifest away")
	}

	if err, _ := g.apply(20, &command{Op: opDeleteDataset, Name: "raw"}).(error); err != nil {
		t.Fatal(err)
	}
	if len(g.st.Datasets) != 0 {
		t.Fatalf("after deleting the parent: %v", g.st.Datasets)
	}
}

type memSink struct{ bytes.Buffer }

func (*memSink) ID() string    { return "mem" }
func (*memSink) Cancel() error { return nil }
func (*memSink) Close() error  { return nil }

var _ raft.SnapshotSink = (*memSink)(nil)
