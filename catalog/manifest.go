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
	return m
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

// Index finds key by binary search; keys are sorted bytewise.
func (m *Manifest) Index(key string) (int, bool) {
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

func (m *Manifest) appendChunk(c *Manifest) {
	base := uint32(len(m.Keys))
	m.Keys += c.Keys
	for _, e := range c.Ends {
		m.Ends = append(m.Ends, base+e)
	}
	m.Sizes = append(m.Sizes, c.Sizes...)
}

// chunks splits entries so no raft entry carries more than maxBytes of keys.
func chunks(entries []source.Entry, maxBytes int) [][]source.Entry {
	var out [][]source.Entry
	start, n := 0, 0
	for i, e := range entries {
		if n+len(e.Key)+16 > maxBytes && i > start {
			out = append(out, entries[start:i])
			start, n = i, 0
		}
		n += len(e.Key) + 16
	}
	if start < len(entries) || len(out) == 0 {
		out = append(out, entries[start:])
	}
	return out
}
