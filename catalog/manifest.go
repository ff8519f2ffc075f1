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

// wellFormed reports whether a chunk's slices agree with each other and its
// key offsets stay inside its keys, ascending.
func (m *Manifest) wellFormed() bool {
	if len(m.Sizes) != len(m.Ends) || (m.Tags != nil && len(m.Tags) != len(m.Ends)) {
		return false
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
