package catalog

import (
	"fmt"
	"testing"

	"stallfree/source"
)

// tarEntries lists shards of samples in archive order; member names within
// a shard are deliberately not sorted, and a shard name sorts between the
// keys of another.
func tarEntries() []source.Entry {
	var out []source.Entry
	for s, shard := range []string{"a.tar", "a.tar.b/c.tar", "d.tar"} {
		off := int64(512)
		for i := 3; i > 0; i-- { // s3, s2, s1
			for _, ext := range []string{"jpg", "cls", "seg.png"} {
				key := fmt.Sprintf("%s/dir/s%d_%d.%s", shard, s, i, ext)
				out = append(out, source.Entry{Key: key, Size: 10, Tag: uint64(s + 1), Shard: shard, ShardSize: 1 << 20, Offset: off})
				off += 1024
			}
		}
	}
	return out
}

// A tar manifest sent in chunks that split shards comes out as one manifest:
// entries, samples (a sample never spans shards), lookups by key, owner keys.
func TestTarManifestAcrossChunks(t *testing.T) {
	entries := tarEntries()
	m := &Manifest{}
	parts := chunks(entries, 100) // a few entries per chunk
	if len(parts) < 6 {
		t.Fatalf("%d chunks: the test needs shards split across chunks", len(parts))
	}
	for _, p := range parts {
		c := NewManifest(p)
		if !c.wellFormed() {
			t.Fatal("a chunk is not well formed")
		}
		m.appendChunk(c)
	}
	m.seal()
	if len(m.Shards) != 3 || m.Len() != len(entries) {
		t.Fatalf("%d shards, %d items; want 3, %d", len(m.Shards), m.Len(), len(entries))
	}
	for i, want := range entries {
		if got := m.Entry(i); got != want {
			t.Fatalf("entry %d: %+v, want %+v", i, got, want)
		}
		if x, ok := m.Index(want.Key); !ok || x != i {
			t.Fatalf("Index(%q) = %d, %v; want %d", want.Key, x, ok, i)
		}
	}
	if _, ok := m.Index("a.tar/dir/s0_9.jpg"); ok {
		t.Fatal("Index found a key the manifest does not hold")
	}
	if m.Samples() != 9 {
		t.Fatalf("%d samples, want 9", m.Samples())
	}
	for s := range m.Samples() {
		first, end := m.Sample(s)
		if end-first != 3 {
			t.Fatalf("sample %d has %d members, want 3", s, end-first)
		}
		shard := []string{"a.tar", "a.tar.b/c.tar", "d.tar"}[s/3]
		want := fmt.Sprintf("%s/dir/s%d_%d", shard, s/3, 3-s%3)
		if m.SampleKey(s) != want {
			t.Fatalf("sample %d key %q, want %q", s, m.SampleKey(s), want)
		}
		for i := first; i < end; i++ {
			if m.SampleOf(i) != s || m.OwnerKey(i) != want {
				t.Fatalf("item %d: sample %d owner key %q; want %d %q", i, m.SampleOf(i), m.OwnerKey(i), s, want)
			}
		}
		if m.Ext(first) != "jpg" || m.Ext(first+2) != "seg.png" {
			t.Fatalf("sample %d extensions %q %q", s, m.Ext(first), m.Ext(first+2))
		}
	}
}

// A chunk whose shard numbers point past its shard list is refused.
func TestMalformedTarChunk(t *testing.T) {
	c := NewManifest(tarEntries()[:3])
	c.ShardOf[1] = 5
	if c.wellFormed() {
		t.Fatal("a chunk naming a shard it does not hold is well formed")
	}
	c = NewManifest(tarEntries()[:3])
	c.Offsets = c.Offsets[:2]
	if c.wellFormed() {
		t.Fatal("a chunk with fewer offsets than items is well formed")
	}
}
