package catalog

import (
	"sort"
	"strings"

	"stallfree/source"
)

// Manifest is a dataset's sorted key list in a pointer-free layout: all keys
// in one string, their end offsets and sizes in flat slices. ImageNet's 1.28 M
// keys are three allocations, not 1.28 M strings for the GC to trace.
type Manifest struct {
	Keys  string   `msgpack:"k"`
	Ends  []uint32 `msgpack:"e"`
	Sizes []int64  `msgpack:"s"`
	// Tags are the entries' version fingerprints, nil when the source has
	// none (directories), so they cost nothing there.
	Tags []uint64 `msgpack:"t,omitempty"`
	// A tar dataset's items are members of shards: ShardOf[i] indexes
	// Shards, Offsets[i] is where the member's bytes start in its shard.
	// All three are nil for other datasets.
	Shards  []Shard  `msgpack:"sh,omitempty"`
	ShardOf []uint32 `msgpack:"so,omitempty"`
	Offsets []int64  `msgpack:"of,omitempty"`

	// LeftOut counts the members a tar source's listing left out.
	LeftOut int `msgpack:"lo,omitempty"`

	tar *tarIndex // derived from the above by seal; nil until then
}

// Shard is one tar shard as indexed.
type Shard struct {
	Key  string `msgpack:"k"`
	Size int64  `msgpack:"s"`
	Tag  uint64 `msgpack:"t,omitempty"`
}

// NewManifest packs sorted entries.
func NewManifest(entries []source.Entry) *Manifest {
	var total int
	for _, e := range entries {
		total += len(e.Key)
	}
	var b strings.Builder
	b.Grow(total)
	m := &Manifest{Ends: make([]uint32, len(entries)), Sizes: make([]int64, len(entries))}
	for i, e := range entries {
		b.WriteString(e.Key)
		m.Ends[i] = uint32(b.Len())
		m.Sizes[i] = e.Size
	}
	m.Keys = b.String()
	if len(entries) > 0 && entries[0].Shard != "" {
		m.ShardOf, m.Offsets = make([]uint32, len(entries)), make([]int64, len(entries))
		for i, e := range entries {
			if n := len(m.Shards); n == 0 || m.Shards[n-1].Key != e.Shard {
				m.Shards = append(m.Shards, Shard{Key: e.Shard, Size: e.ShardSize, Tag: e.Tag})
			}
			m.ShardOf[i], m.Offsets[i] = uint32(len(m.Shards)-1), e.Offset
		}
		m.seal()
		return m
	}
	for i, e := range entries {
		if e.Tag != 0 && m.Tags == nil {
			m.Tags = make([]uint64, len(entries))
		}
		if m.Tags != nil {
			m.Tags[i] = e.Tag
		}
	}
	return m
}

// Entry returns the i-th manifest line, what a source reads by.
func (m *Manifest) Entry(i int) source.Entry {
	e := source.Entry{Key: m.Key(i), Size: m.Sizes[i]}
	if m.Tags != nil {
		e.Tag = m.Tags[i]
	}
	if m.Shards != nil {
		sh := m.Shards[m.ShardOf[i]]
		e.Shard, e.ShardSize, e.Tag, e.Offset = sh.Key, sh.Size, sh.Tag, m.Offsets[i]
	}
	return e
}

// Len is the number of items.
func (m *Manifest) Len() int { return len(m.Ends) }

// Key returns the i-th key.
func (m *Manifest) Key(i int) string {
	start := uint32(0)
	if i > 0 {
		start = m.Ends[i-1]
	}
	return m.Keys[start:m.Ends[i]]
}

// Size returns the i-th item's size in bytes.
func (m *Manifest) Size(i int) int64 { return m.Sizes[i] }

// Index finds key by binary search: over the keys, sorted bytewise, or for a
// tar dataset (in archive order) over its sorted permutation.
func (m *Manifest) Index(key string) (int, bool) {
	if t := m.tar; t != nil {
		x := sort.Search(len(t.byKey), func(x int) bool { return m.Key(int(t.byKey[x])) >= key })
		if x < len(t.byKey) && m.Key(int(t.byKey[x])) == key {
			return int(t.byKey[x]), true
		}
		return 0, false
	}
	i := sort.Search(m.Len(), func(i int) bool { return m.Key(i) >= key })
	return i, i < m.Len() && m.Key(i) == key
}

// TotalBytes is the sum of item sizes.
func (m *Manifest) TotalBytes() int64 {
	var n int64
	for _, s := range m.Sizes {
		n += s
	}
	return n
}

// wellFormed reports whether a chunk's slices agree with each other and its
// key offsets stay inside its keys, ascending.
func (m *Manifest) wellFormed() bool {
	if len(m.Sizes) != len(m.Ends) || (m.Tags != nil && len(m.Tags) != len(m.Ends)) {
		return false
	}
	if m.Shards != nil || m.ShardOf != nil || m.Offsets != nil {
		if len(m.ShardOf) != len(m.Ends) || len(m.Offsets) != len(m.Ends) || m.Tags != nil {
			return false
		}
		for _, s := range m.ShardOf {
			if int(s) >= len(m.Shards) {
				return false
			}
		}
	}
	prev := uint32(0)
	for _, e := range m.Ends {
		if e < prev || int(e) > len(m.Keys) {
			return false
		}
		prev = e
	}
	return true
}

func (m *Manifest) appendChunk(c *Manifest) {
	base := uint32(len(m.Keys))
	m.Keys += c.Keys
	for _, e := range c.Ends {
		m.Ends = append(m.Ends, base+e)
	}
	// Chunks of one manifest come from one source: all tagged or none.
	if c.Tags != nil {
		if m.Tags == nil {
			m.Tags = make([]uint64, len(m.Sizes))
		}
		m.Tags = append(m.Tags, c.Tags...)
	} else if m.Tags != nil {
		m.Tags = append(m.Tags, make([]uint64, len(c.Sizes))...)
	}
	m.Sizes = append(m.Sizes, c.Sizes...)
	m.LeftOut += c.LeftOut
	if c.Shards != nil {
		// A shard split over two chunks is one shard: the chunk's first
		// shard is then the manifest's last.
		base, first := uint32(len(m.Shards)), 0
		if n := len(m.Shards); n > 0 && m.Shards[n-1] == c.Shards[0] {
			base, first = uint32(n-1), 1
		}
		m.Shards = append(m.Shards, c.Shards[first:]...)
		for _, s := range c.ShardOf {
			m.ShardOf = append(m.ShardOf, base+s)
		}
		m.Offsets = append(m.Offsets, c.Offsets...)
	}
}

// chunks splits entries so no raft entry carries more than maxBytes of keys.
func chunks(entries []source.Entry, maxBytes int) [][]source.Entry {
	var out [][]source.Entry
	start, n := 0, 0
	for i, e := range entries {
		if n+len(e.Key)+24 > maxBytes && i > start {
			out = append(out, entries[start:i])
			start, n = i, 0
		}
		n += len(e.Key) + 24
	}
	if start < len(entries) || len(out) == 0 {
		out = append(out, entries[start:])
	}
	return out
}

// tarIndex is what a tar manifest derives from its keys: their bytewise
// order (keys are stored in archive order) and the WebDataset samples.
type tarIndex struct {
	byKey []uint32
	// samples[s] is the first item of sample s; samples[len-1] = Len().
	samples []uint32
}

// seal derives a tar manifest's index once its items are all in (a
// committed or restored dataset); manifests of other sources have none.
func (m *Manifest) seal() {
	if m.Shards == nil || m.tar != nil {
		return
	}
	t := &tarIndex{byKey: make([]uint32, m.Len())}
	for i := range t.byKey {
		t.byKey[i] = uint32(i)
	}
	sort.Slice(t.byKey, func(a, b int) bool { return m.Key(int(t.byKey[a])) < m.Key(int(t.byKey[b])) })
	prev := ""
	for i := range m.Len() {
		if k := m.sampleKeyOf(i); i == 0 || k != prev {
			t.samples = append(t.samples, uint32(i))
			prev = k
		}
	}
	t.samples = append(t.samples, uint32(m.Len()))
	m.tar = t
}

// IsTar reports whether the items are members of tar shards.
func (m *Manifest) IsTar() bool { return m.Shards != nil }

// sampleKeyOf is member i's WebDataset sample key: SHARD/ and the member's
// path up to the first "." of its base name.
func (m *Manifest) sampleKeyOf(i int) string {
	key := m.Key(i)
	member := len(m.Shards[m.ShardOf[i]].Key) + 1 // after "SHARD/"
	dir := member + strings.LastIndexByte(key[member:], '/') + 1
	if dot := strings.IndexByte(key[dir:], '.'); dot >= 0 {
		return key[:dir+dot]
	}
	return key
}

// Ext is member i's extension in its sample: its base name after the first
// "." ("jpg", "seg.png"; "" when it has none).
func (m *Manifest) Ext(i int) string { return ExtOf(m.Key(i), m.sampleKeyOf(i)) }

// ExtOf is a member's extension given its key and its sample's key.
func ExtOf(memberKey, sampleKey string) string {
	return strings.TrimPrefix(memberKey[len(sampleKey):], ".")
}

// Samples is the number of WebDataset samples (0: not a tar dataset).
func (m *Manifest) Samples() int {
	if m.tar == nil {
		return 0
	}
	return len(m.tar.samples) - 1
}

// Sample returns the items [first, end) of sample s.
func (m *Manifest) Sample(s int) (first, end int) {
	return int(m.tar.samples[s]), int(m.tar.samples[s+1])
}

// SampleKey is sample s's key, SHARD/SAMPLEKEY.
func (m *Manifest) SampleKey(s int) string { return m.sampleKeyOf(int(m.tar.samples[s])) }

// SampleOf is the sample item i belongs to.
func (m *Manifest) SampleOf(i int) int {
	return sort.Search(len(m.tar.samples), func(s int) bool { return int(m.tar.samples[s]) > i }) - 1
}

// ShardItems returns the items [first, end) of shard s: a shard's members
// are consecutive items, in archive order (offsets ascending).
func (m *Manifest) ShardItems(s int) (first, end int) {
	first = sort.Search(len(m.ShardOf), func(i int) bool { return int(m.ShardOf[i]) >= s })
	end = sort.Search(len(m.ShardOf), func(i int) bool { return int(m.ShardOf[i]) > s })
	return first, end
}

// ShardEntry is what a shard is read by as a whole (source.Streamer).
func (m *Manifest) ShardEntry(s int) source.Entry {
	sh := m.Shards[s]
	return source.Entry{Key: sh.Key, Size: sh.Size, Tag: sh.Tag}
}

// OwnerKey is what decides item i's owner: its key, or for a tar dataset its
// sample's key, so that all members of a sample have one owner.
func (m *Manifest) OwnerKey(i int) string {
	if m.Shards != nil {
		return m.sampleKeyOf(i)
	}
	return m.Key(i)
}
