package catalog

import (
	"encoding/binary"
	"math"
	"sort"
	"strings"

	"stallfree/source"
)

// Manifest is a dataset's key list in a pointer-free, front-coded layout:
// keys in blocks of manifestBlock, each block's first key whole and every
// other key as the length of the prefix it shares with the key before plus
// the rest. ImageNet-shaped keys (36 bytes) cost ~12 bytes each this way,
// and 10 M keys are a handful of allocations for the GC, not 10 M strings.
// Sizes and block offsets are little-endian bytes, so a chunk travels in raft
// and snapshots as a few binary strings rather than millions of integers.
type Manifest struct {
	Blocks []byte `msgpack:"fb"`
	Starts []byte `msgpack:"fs"` // uint64 per block: where it begins in Blocks
	Sizes  []byte `msgpack:"fz"` // uint32 per item (MaxItemSize is 256 MiB)
	Count  int    `msgpack:"n"`
	// Tags are the entries' version fingerprints, nil when the source has
	// none, so they cost nothing there. Where every fingerprint of a chunk
	// fits in 32 bits (a directory's folded mtimes) they are Stamps instead:
	// a uint32 an item, little-endian, half the memory and one binary string
	// in raft and snapshots. At most one of the two is set.
	Tags   []uint64 `msgpack:"t,omitempty"`
	Stamps []byte   `msgpack:"ft,omitempty"`
	// A tar dataset's items are members of shards: ShardOf[i] indexes
	// Shards, Offsets[i] is where the member's bytes start in its shard.
	// All three are nil for other datasets.
	Shards  []Shard  `msgpack:"sh,omitempty"`
	ShardOf []uint32 `msgpack:"so,omitempty"`
	Offsets []int64  `msgpack:"of,omitempty"`

	// LeftOut counts the members a tar source's listing left out.
	LeftOut int `msgpack:"lo,omitempty"`

	// The layout before front coding: all keys in one string, their end
	// offsets and sizes. Raft logs and snapshots written by earlier
	// versions hold it; upgrade converts it when it is read.
	OldKeys  string   `msgpack:"k,omitempty"`
	OldEnds  []uint32 `msgpack:"e,omitempty"`
	OldSizes []int64  `msgpack:"s,omitempty"`

	totalBytes int64     // derived by seal
	tar        *tarIndex // derived from the above by seal; nil until then
}

// manifestBlock keys share a block: a lookup decodes at most this many, and
// a block's first key costs its whole length once.
const manifestBlock = 16

// Shard is one tar shard as indexed.
type Shard struct {
	Key  string `msgpack:"k"`
	Size int64  `msgpack:"s"`
	Tag  uint64 `msgpack:"t,omitempty"`
}

// NewManifest packs entries (sorted, or a tar source's archive order).
func NewManifest(entries []source.Entry) *Manifest {
	m := &Manifest{Sizes: make([]byte, 0, 4*len(entries)), Starts: make([]byte, 0, 8*blocks(len(entries)))}
	prev := ""
	for _, e := range entries {
		m.add(prev, e.Key, e.Size)
		prev = e.Key
	}
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
	tagged, small := false, true
	for _, e := range entries {
		tagged = tagged || e.Tag != 0
		small = small && e.Tag <= math.MaxUint32
	}
	switch {
	case tagged && small:
		m.Stamps = make([]byte, 0, 4*len(entries))
		for _, e := range entries {
			m.Stamps = binary.LittleEndian.AppendUint32(m.Stamps, uint32(e.Tag))
		}
	case tagged:
		m.Tags = make([]uint64, len(entries))
		for i, e := range entries {
			m.Tags[i] = e.Tag
		}
	}
	return m
}

// tag is item i's fingerprint (0: none).
func (m *Manifest) tag(i int) uint64 {
	switch {
	case m.Tags != nil:
		return m.Tags[i]
	case m.Stamps != nil:
		return uint64(binary.LittleEndian.Uint32(m.Stamps[4*i:]))
	}
	return 0
}

// widenTags turns Stamps (or no fingerprints) into Tags of Count items, for
// a merge with a chunk whose fingerprints do not fit in 32 bits.
func (m *Manifest) widenTags() {
	if m.Tags != nil {
		return
	}
	tags := make([]uint64, m.Count)
	for i := range tags {
		tags[i] = m.tag(i)
	}
	m.Tags, m.Stamps = tags, nil
}

func blocks(items int) int { return (items + manifestBlock - 1) / manifestBlock }

// add appends one key, front-coded against prev, the key added before it.
func (m *Manifest) add(prev, key string, size int64) {
	shared := 0
	if m.Count%manifestBlock == 0 {
		m.Starts = binary.LittleEndian.AppendUint64(m.Starts, uint64(len(m.Blocks)))
	} else {
		for shared < len(key) && shared < len(prev) && key[shared] == prev[shared] {
			shared++
		}
	}
	m.Blocks = binary.AppendUvarint(m.Blocks, uint64(shared))
	m.Blocks = binary.AppendUvarint(m.Blocks, uint64(len(key)-shared))
	m.Blocks = append(m.Blocks, key[shared:]...)
	m.Sizes = binary.LittleEndian.AppendUint32(m.Sizes, uint32(size))
	m.Count++
}

// Entry returns the i-th manifest line, what a source reads by.
func (m *Manifest) Entry(i int) source.Entry {
	e := source.Entry{Key: m.Key(i), Size: m.Size(i), Tag: m.tag(i)}
	if m.Shards != nil {
		sh := m.Shards[m.ShardOf[i]]
		e.Shard, e.ShardSize, e.Tag, e.Offset = sh.Key, sh.Size, sh.Tag, m.Offsets[i]
	}
	return e
}

// Len is the number of items.
func (m *Manifest) Len() int { return m.Count }

// Key returns the i-th key.
func (m *Manifest) Key(i int) string {
	var buf [256]byte
	return string(m.appendKey(buf[:0], i))
}

// appendKey appends the i-th key to buf: its block's keys are decoded up to
// it.
func (m *Manifest) appendKey(buf []byte, i int) []byte {
	p := m.blockStart(i / manifestBlock)
	for range i%manifestBlock + 1 {
		buf, p = m.step(buf, p)
	}
	return buf
}

// step turns buf, the key before the one coded at p, into that key, and
// returns where the key after it begins.
func (m *Manifest) step(buf []byte, p int) ([]byte, int) {
	shared, rest, after := m.next(p)
	return append(buf[:shared], rest...), after
}

func (m *Manifest) blockStart(b int) int { return int(binary.LittleEndian.Uint64(m.Starts[8*b:])) }

// next decodes the key coded at p: the prefix it shares with the key before,
// its own rest, and where the key after it begins. Coded keys were checked
// by wellFormed, so the slicing stays in bounds.
func (m *Manifest) next(p int) (shared int, rest []byte, after int) {
	s, n := binary.Uvarint(m.Blocks[p:])
	p += n
	l, n := binary.Uvarint(m.Blocks[p:])
	p += n
	return int(s), m.Blocks[p : p+int(l)], p + int(l)
}

// Size returns the i-th item's size in bytes.
func (m *Manifest) Size(i int) int64 { return int64(binary.LittleEndian.Uint32(m.Sizes[4*i:])) }

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
	// The last block whose first key is at most key holds it, if anyone does.
	b := sort.Search(blocks(m.Count), func(b int) bool {
		_, first, _ := m.next(m.blockStart(b))
		return string(first) > key
	}) - 1
	if b < 0 {
		return 0, false
	}
	var buf [256]byte
	k, p := buf[:0], m.blockStart(b)
	for i := b * manifestBlock; i < min(m.Count, (b+1)*manifestBlock); i++ {
		k, p = m.step(k, p)
		if string(k) == key {
			return i, true
		}
		if string(k) > key {
			return 0, false
		}
	}
	return 0, false
}

// TotalBytes is the sum of item sizes.
func (m *Manifest) TotalBytes() int64 {
	if m.totalBytes == 0 { // not sealed (a chunk, a pending manifest)
		return m.sumSizes()
	}
	return m.totalBytes
}

func (m *Manifest) sumSizes() int64 {
	var n int64
	for i := range m.Count {
		n += m.Size(i)
	}
	return n
}

// Bytes is what the manifest holds in memory.
func (m *Manifest) Bytes() int64 {
	n := len(m.Blocks) + len(m.Starts) + len(m.Sizes) + 8*len(m.Tags) + len(m.Stamps) + 4*len(m.ShardOf) + 8*len(m.Offsets)
	if t := m.tar; t != nil {
		n += 4 * (len(t.byKey) + len(t.samples))
	}
	return int64(n)
}

// wellFormed reports whether a chunk's parts agree with each other: sizes
// and block offsets for Count items, every coded key inside its block and
// within the key limit, a tar chunk's shard numbers inside its shard list.
func (m *Manifest) wellFormed() bool {
	if m.Count < 0 || len(m.Sizes) != 4*m.Count || len(m.Starts) != 8*blocks(m.Count) ||
		(m.Tags != nil && len(m.Tags) != m.Count) || (m.Stamps != nil && len(m.Stamps) != 4*m.Count) ||
		(m.Tags != nil && m.Stamps != nil) {
		return false
	}
	if m.Shards != nil || m.ShardOf != nil || m.Offsets != nil {
		if len(m.ShardOf) != m.Count || len(m.Offsets) != m.Count || m.Tags != nil || m.Stamps != nil {
			return false
		}
		for _, s := range m.ShardOf {
			if int(s) >= len(m.Shards) {
				return false
			}
		}
	}
	for i := range m.Count {
		if m.Size(i) > source.MaxItemSize {
			return false
		}
	}
	for b := range blocks(m.Count) {
		p := m.blockStart(b)
		end := len(m.Blocks)
		if b+1 < blocks(m.Count) {
			end = m.blockStart(b + 1)
		}
		if (b == 0 && p != 0) || p > end || end > len(m.Blocks) {
			return false
		}
		prev := 0 // length of the key before
		for k := 0; k < min(manifestBlock, m.Count-b*manifestBlock); k++ {
			s, n := binary.Uvarint(m.Blocks[p:end])
			if n <= 0 || (k == 0 && s != 0) || s > uint64(prev) {
				return false
			}
			p += n
			l, n := binary.Uvarint(m.Blocks[p:end])
			if n <= 0 || l > uint64(end-p-n) || s+l == 0 || s+l > maxKeyBytes {
				return false
			}
			p += n + int(l)
			prev = int(s + l)
		}
		if p != end {
			return false
		}
	}
	return true
}

// maxKeyBytes is source.ValidKey's limit.
const maxKeyBytes = 4096

// appendChunk adds a chunk's items after the manifest's own. A chunk that
// starts on a block boundary (chunks splits them so) has its blocks appended
// as they are; one that does not (written by an earlier version) is coded
// key by key.
func (m *Manifest) appendChunk(c *Manifest) {
	if m.Count%manifestBlock == 0 {
		base := uint64(len(m.Blocks))
		m.Blocks = append(m.Blocks, c.Blocks...)
		for b := range blocks(c.Count) {
			m.Starts = binary.LittleEndian.AppendUint64(m.Starts, base+uint64(c.blockStart(b)))
		}
		m.Sizes = append(m.Sizes, c.Sizes...)
		m.Count += c.Count
	} else {
		prev := m.Key(m.Count - 1)
		for i := range c.Count {
			key := c.Key(i)
			m.add(prev, key, c.Size(i))
			prev = key
		}
	}
	// Chunks of one manifest come from one source, tagged or not; 32-bit
	// fingerprints stay Stamps unless a chunk needs Tags.
	before := m.Count - c.Count
	switch {
	case c.Tags == nil && c.Stamps == nil && m.Tags == nil && m.Stamps == nil:
	case c.Tags == nil && m.Tags == nil:
		if m.Stamps == nil {
			m.Stamps = make([]byte, 4*before)
		}
		if c.Stamps == nil {
			m.Stamps = append(m.Stamps, make([]byte, 4*c.Count)...)
		} else {
			m.Stamps = append(m.Stamps, c.Stamps...)
		}
	default:
		m.Count = before // widen what was there before the chunk
		m.widenTags()
		m.Count += c.Count
		for i := range c.Count {
			m.Tags = append(m.Tags, c.tag(i))
		}
	}
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

// upgrade converts a manifest read in the layout before front coding. It
// reports false when the old parts disagree with each other.
func (m *Manifest) upgrade() bool {
	if m.OldKeys == "" && m.OldEnds == nil && m.OldSizes == nil {
		return true
	}
	if len(m.OldSizes) != len(m.OldEnds) || m.Count != 0 || m.Blocks != nil {
		return false
	}
	prev := uint32(0)
	for _, e := range m.OldEnds {
		if e < prev || int(e) > len(m.OldKeys) {
			return false
		}
		prev = e
	}
	start, before := uint32(0), ""
	for i, end := range m.OldEnds {
		key := m.OldKeys[start:end]
		m.add(before, key, m.OldSizes[i])
		start, before = end, key
	}
	m.OldKeys, m.OldEnds, m.OldSizes = "", nil, nil
	return true
}

// chunks splits entries so no raft entry carries much more than maxBytes of
// keys. Every chunk but the last holds whole blocks, so the chunks' blocks
// join as they are.
func chunks(entries []source.Entry, maxBytes int) [][]source.Entry {
	var out [][]source.Entry
	for start := 0; start < len(entries); {
		end, n := start, 0
		for end < len(entries) && (end-start < manifestBlock || n+len(entries[end].Key)+8 <= maxBytes) {
			n += len(entries[end].Key) + 8
			end++
		}
		if end < len(entries) {
			end = start + (end-start)/manifestBlock*manifestBlock
		}
		out = append(out, entries[start:end])
		start = end
	}
	if len(out) == 0 {
		out = append(out, entries)
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
	m.totalBytes = m.sumSizes()
	// Appending chunks left up to a quarter of slack behind; a committed
	// manifest never grows again.
	m.Blocks, m.Starts, m.Sizes = fit(m.Blocks), fit(m.Starts), fit(m.Sizes)
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

// fit returns b in an array of its own length when b's has more than a
// little slack.
func fit(b []byte) []byte {
	if cap(b)-len(b) <= len(b)/32 {
		return b
	}
	return append(make([]byte, 0, len(b)), b...)
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
