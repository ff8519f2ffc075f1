package catalog

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/hashicorp/raft"
	"github.com/vmihailenco/msgpack/v5"

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
	parts := chunks(entries, 100) // one block per chunk
	if len(parts) < 2 || parts[1][0].Shard != parts[0][len(parts[0])-1].Shard {
		t.Fatalf("%d chunks: the test needs a shard split across chunks", len(parts))
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

// frontCodingKeys are sorted keys that stress the coding: a key that is a
// prefix of the next, keys sharing nothing, multibyte characters, keys
// longer than the decoder's stack buffer, one at the key limit.
func frontCodingKeys(n int) []source.Entry {
	keys := []string{"a", "a/b", "a/b/c", "a/bb", "ab", "b", "b/" + strings.Repeat("x", 300),
		"b/" + strings.Repeat("x", 300) + "y", "c/" + strings.Repeat("z", maxKeyBytes-2), "d/é", "d/éé", "e"}
	for i := 0; len(keys) < n; i++ {
		keys = append(keys, fmt.Sprintf("f/%06d", i))
	}
	out := make([]source.Entry, n)
	for i := range out {
		out[i] = source.Entry{Key: keys[i], Size: int64(i * 1000)}
	}
	return out
}

// Every key and size comes back, by position and by lookup, whatever the
// item count against the block size; keys that are not there are not found.
func TestFrontCodedManifestRoundTrip(t *testing.T) {
	for _, n := range []int{1, 12, manifestBlock - 1, manifestBlock, manifestBlock + 1, 3*manifestBlock + 5} {
		es := frontCodingKeys(n)
		m := NewManifest(es)
		if !m.wellFormed() || m.Len() != n {
			t.Fatalf("%d items: well formed %v, %d items", n, m.wellFormed(), m.Len())
		}
		var total int64
		for i, e := range es {
			if m.Key(i) != e.Key || m.Size(i) != e.Size {
				t.Fatalf("%d items: item %d is %q (%d), want %q (%d)", n, i, m.Key(i), m.Size(i), e.Key, e.Size)
			}
			if x, ok := m.Index(e.Key); !ok || x != i {
				t.Fatalf("%d items: Index(%q) = %d %v, want %d", n, e.Key, x, ok, i)
			}
			total += e.Size
		}
		if m.TotalBytes() != total {
			t.Fatalf("%d items: %d bytes in all, want %d", n, m.TotalBytes(), total)
		}
		for _, absent := range []string{"0", "a/", "a/b/", "aa", "b/x", "d/", "f/", "zz", es[n-1].Key + "0"} {
			if x, ok := m.Index(absent); ok {
				t.Fatalf("%d items: Index(%q) found item %d", n, absent, x)
			}
		}
	}
}

// Chunks join into the manifest one coding of all the keys gives, and a
// chunk that does not start on a block boundary (an earlier version cut
// chunks anywhere) is coded key by key.
func TestManifestChunksJoin(t *testing.T) {
	es := frontCodingKeys(200)
	whole := NewManifest(es)
	m := &Manifest{}
	for _, p := range chunks(es, 600) {
		if len(p)%manifestBlock != 0 && &p[len(p)-1] != &es[len(es)-1] {
			t.Fatalf("a chunk of %d items that is not the last", len(p))
		}
		m.appendChunk(NewManifest(p))
	}
	if !bytes.Equal(m.Blocks, whole.Blocks) || !bytes.Equal(m.Starts, whole.Starts) || !bytes.Equal(m.Sizes, whole.Sizes) {
		t.Fatal("chunks joined differ from the whole manifest coded at once")
	}
	m = &Manifest{}
	for _, p := range [][]source.Entry{es[:5], es[5:40], es[40:]} {
		m.appendChunk(NewManifest(p))
	}
	if !m.wellFormed() {
		t.Fatal("joined unaligned chunks are not well formed")
	}
	for i, e := range es {
		if m.Key(i) != e.Key || m.Size(i) != e.Size {
			t.Fatalf("unaligned chunks: item %d is %q, want %q", i, m.Key(i), e.Key)
		}
	}
}

// A chunk in the layout before front coding, as a raft log written by an
// earlier version holds it, registers the same dataset.
func TestOldManifestLayoutIsUpgraded(t *testing.T) {
	es := frontCodingKeys(40)
	old := &Manifest{}
	for _, e := range es {
		old.OldKeys += e.Key
		old.OldEnds = append(old.OldEnds, uint32(len(old.OldKeys)))
		old.OldSizes = append(old.OldSizes, e.Size)
	}
	f := &fsm{st: newState()}
	for i, c := range []*command{{Op: opBegin, Name: "d", Source: "dir:///d", Token: "t", Count: len(es)},
		{Op: opChunk, Name: "d", Token: "t", Chunk: old}, {Op: opCommit, Name: "d", Token: "t"}} {
		b, err := msgpack.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if err, ok := f.Apply(&raft.Log{Index: uint64(i + 1), Data: b}).(error); ok {
			t.Fatalf("command %d: %v", i, err)
		}
	}
	d := f.st.Datasets["d"]
	if d == nil || d.Manifest.Len() != len(es) {
		t.Fatalf("dataset %+v", d)
	}
	for i, e := range es {
		if d.Manifest.Key(i) != e.Key || d.Manifest.Size(i) != e.Size {
			t.Fatalf("item %d is %q, want %q", i, d.Manifest.Key(i), e.Key)
		}
	}
	bad := &Manifest{OldKeys: "ab", OldEnds: []uint32{1, 3}, OldSizes: []int64{1, 2}}
	if bad.upgrade() {
		t.Fatal("an old chunk whose key ends pass its keys was upgraded")
	}
}

// A chunk whose coding does not hold together is refused before it is
// applied: every way of cutting or bending one below.
func TestMalformedFrontCodedChunk(t *testing.T) {
	mk := func() *Manifest { return NewManifest(frontCodingKeys(2*manifestBlock + 3)) }
	breaks := map[string]func(m *Manifest){
		"blocks cut short":          func(m *Manifest) { m.Blocks = m.Blocks[:len(m.Blocks)-1] },
		"a byte after the blocks":   func(m *Manifest) { m.Blocks = append(m.Blocks, 0) },
		"a block offset missing":    func(m *Manifest) { m.Starts = m.Starts[:len(m.Starts)-8] },
		"block offsets out of turn": func(m *Manifest) { binary.LittleEndian.PutUint64(m.Starts[8:], uint64(len(m.Blocks)+1)) },
		"a first block not at 0":    func(m *Manifest) { binary.LittleEndian.PutUint64(m.Starts, 1) },
		"a size missing":            func(m *Manifest) { m.Sizes = m.Sizes[:len(m.Sizes)-4] },
		"one item too many":         func(m *Manifest) { m.Count++ },
		"a size past the limit":     func(m *Manifest) { binary.LittleEndian.PutUint32(m.Sizes, source.MaxItemSize+1) },
		"a first key sharing":       func(m *Manifest) { m.Blocks[0] = 1 },
		"sharing more than the key before": func(m *Manifest) {
			_, _, p := m.next(0) // the second key, "a/b", shares 1 byte with "a"
			m.Blocks[p] = 2
		},
		"a key running past its block": func(m *Manifest) {
			_, _, p := m.next(0)
			m.Blocks[p+1] = 120
		},
	}
	for name, bend := range breaks {
		m := mk()
		bend(m)
		if m.wellFormed() {
			t.Errorf("%s: well formed", name)
		}
	}
	if !mk().wellFormed() {
		t.Fatal("the unbent chunk is not well formed")
	}
}

// ImageNet-shaped keys cost a third of their length: what a node holds per
// item of a directory dataset.
func TestManifestBytesPerItem(t *testing.T) {
	es := make([]source.Entry, 100_000)
	for i := range es {
		class := 1440764 + i/1300
		es[i] = source.Entry{Key: fmt.Sprintf("train/n%08d/n%08d_%d.JPEG", class, class, 10000+i%1300*7), Size: 110 << 10}
	}
	slices.SortFunc(es, func(a, b source.Entry) int { return strings.Compare(a.Key, b.Key) })
	m := NewManifest(es)
	m.seal()
	perItem := float64(m.Bytes()) / float64(m.Len())
	t.Logf("%.1f bytes per item for %d-byte keys", perItem, len(es[0].Key))
	if perItem > 20 {
		t.Fatalf("%.1f bytes per item, want at most 20", perItem)
	}
}
