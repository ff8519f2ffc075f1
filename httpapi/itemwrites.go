package httpapi

import (
	"errors"
	"fmt"
	"math"

	"stallfree/api"
)

// errTooManyItems is a batch write of more items than its limit.
type errTooManyItems struct{ n, limit int }

func (e errTooManyItems) Error() string {
	return fmt.Sprintf("%d items in one batch; the limit is %d", e.n, e.limit)
}

// minItemWrite is the size of the smallest element a batch write can hold:
// a map of two pairs, "index" with a one-byte integer and "data" with empty
// binary (1 + 6 + 1 + 5 + 2 bytes).
const minItemWrite = 15

// decodeItemWrites reads the body of a batch write: one msgpack array of at
// most limit maps, each with an integer "index" and binary "data" and
// nothing else, and no byte after the array. More elements than limit is
// an errTooManyItems, found before anything is allocated for them.
//
// Each item's Data is a slice of body, not a copy. A prep cache's first
// epoch sends a minibatch of decoded arrays per request (12 MiB for 64 of
// 256×256×3); a general decoder copied each into fresh heap memory that the
// store then copied again, and that copy with its page faults was a sixth of
// the node's CPU in a first fill. The format is small enough to read by
// hand, and FuzzDecodeItemWrites holds this reader to the msgpack library's
// answers.
func decodeItemWrites(body []byte, limit int) ([]api.ItemWrite, error) {
	r := mpReader{b: body}
	n, err := r.header(mpArray)
	if err != nil {
		return nil, err
	}
	// An element costs 32 bytes here and 15 of the body at least: a count
	// that one byte an element allows would still have a 256 MiB body
	// allocate 8 GiB.
	if left := len(r.b) - r.at; n > left/minItemWrite {
		return nil, fmt.Errorf("an array of %d maps in the %d bytes left (each takes %d at least)", n, left, minItemWrite)
	}
	if n > limit {
		return nil, errTooManyItems{n, limit}
	}
	items := make([]api.ItemWrite, n)
	for j := range items {
		if items[j], err = r.itemWrite(); err != nil {
			return nil, fmt.Errorf("element %d: %w", j, err)
		}
	}
	if rest := len(r.b) - r.at; rest > 0 {
		return nil, fmt.Errorf("%d bytes after the array", rest)
	}
	return items, nil
}

// mpReader reads msgpack values from b, from at on.
type mpReader struct {
	b  []byte
	at int
}

// The container and string kinds a header can announce.
type mpKind int

const (
	mpArray mpKind = iota
	mpMap
	mpStr
	mpBin
)

func (k mpKind) String() string {
	return [...]string{"an array", "a map", "a string", "binary"}[k]
}

// mpNil is msgpack's nil.
const mpNil = 0xc0

var errTruncated = errors.New("the body ends inside a value")

// next takes n bytes.
func (r *mpReader) next(n int) ([]byte, error) {
	if n < 0 || n > len(r.b)-r.at {
		return nil, errTruncated
	}
	p := r.b[r.at : r.at+n : r.at+n]
	r.at += n
	return p, nil
}

// uint reads a big-endian unsigned integer of width bytes.
func (r *mpReader) uint(width int) (uint64, error) {
	p, err := r.next(width)
	if err != nil {
		return 0, err
	}
	var v uint64
	for _, c := range p {
		v = v<<8 | uint64(c)
	}
	return v, nil
}

// header reads the header of a value of kind want and returns its count
// (elements, pairs or bytes).
func (r *mpReader) header(want mpKind) (int, error) {
	p, err := r.next(1)
	if err != nil {
		return 0, err
	}
	c := p[0]
	kind, width, count := mpKind(-1), 0, -1
	switch {
	case c >= 0x90 && c <= 0x9f:
		kind, count = mpArray, int(c&0x0f)
	case c >= 0x80 && c <= 0x8f:
		kind, count = mpMap, int(c&0x0f)
	case c >= 0xa0 && c <= 0xbf:
		kind, count = mpStr, int(c&0x1f)
	case c == 0xdc || c == 0xdd:
		kind, width = mpArray, 2<<(c-0xdc)
	case c == 0xde || c == 0xdf:
		kind, width = mpMap, 2<<(c-0xde)
	case c >= 0xd9 && c <= 0xdb:
		kind, width = mpStr, 1<<(c-0xd9)
	case c >= 0xc4 && c <= 0xc6:
		kind, width = mpBin, 1<<(c-0xc4)
	}
	if kind != want {
		return 0, fmt.Errorf("want %v, found %s", want, mpName(c))
	}
	v := uint64(count)
	if count < 0 {
		if v, err = r.uint(width); err != nil {
			return 0, err
		}
	}
	// Every element, pair or byte takes a byte of the body at least: a
	// count beyond what is left is a lie, refused before anything is
	// allocated for it.
	if left := len(r.b) - r.at; v > uint64(left) {
		return 0, fmt.Errorf("%v of %d in the %d bytes left", want, v, left)
	}
	return int(v), nil
}

// int reads an integer of any msgpack width, as an int.
func (r *mpReader) int() (int, error) {
	p, err := r.next(1)
	if err != nil {
		return 0, err
	}
	c := p[0]
	switch {
	case c <= 0x7f:
		return int(c), nil
	case c >= 0xe0:
		return int(int8(c)), nil
	case c >= 0xcc && c <= 0xcf: // uint8 … uint64
		v, err := r.uint(1 << (c - 0xcc))
		if err != nil {
			return 0, err
		}
		if v > math.MaxInt {
			return 0, fmt.Errorf("%d is out of range", v)
		}
		return int(v), nil
	case c >= 0xd0 && c <= 0xd3: // int8 … int64
		width := 1 << (c - 0xd0)
		v, err := r.uint(width)
		if err != nil {
			return 0, err
		}
		shift := 64 - 8*width // sign-extend from width bytes
		return int(int64(v<<shift) >> shift), nil
	case c == mpNil:
		return 0, errors.New("missing")
	}
	return 0, fmt.Errorf("%s is not an integer", mpName(c))
}

// itemWrite reads one {"index", "data"} map.
func (r *mpReader) itemWrite() (api.ItemWrite, error) {
	if r.at < len(r.b) && r.b[r.at] == mpNil {
		return api.ItemWrite{}, errors.New("nil, not a map")
	}
	pairs, err := r.header(mpMap)
	if err != nil {
		return api.ItemWrite{}, err
	}
	var (
		it                  api.ItemWrite
		haveIndex, haveData bool
	)
	for range pairs {
		n, err := r.header(mpStr)
		if err != nil {
			return it, fmt.Errorf("a key: %w", err)
		}
		key, err := r.next(n)
		if err != nil {
			return it, err
		}
		switch string(key) {
		case "index":
			if haveIndex {
				return it, errors.New(`"index" twice`)
			}
			if it.Index, err = r.int(); err != nil {
				return it, fmt.Errorf(`"index": %w`, err)
			}
			haveIndex = true
		case "data":
			if haveData {
				return it, errors.New(`"data" twice`)
			}
			if r.at < len(r.b) && r.b[r.at] == mpNil {
				return it, errors.New(`no "data" (binary)`)
			}
			n, err := r.header(mpBin)
			if err != nil {
				return it, fmt.Errorf(`"data": %w`, err)
			}
			if it.Data, err = r.next(n); err != nil {
				return it, err
			}
			haveData = true
		default:
			return it, fmt.Errorf("unknown field %q", key)
		}
	}
	switch {
	case !haveIndex:
		return it, errors.New(`"index": missing`)
	case !haveData:
		return it, errors.New(`no "data" (binary)`)
	}
	return it, nil
}

// mpName says what a value's first byte announces, for errors.
func mpName(c byte) string {
	switch {
	case c <= 0x7f || c >= 0xe0 || (c >= 0xcc && c <= 0xd3):
		return "an integer"
	case c == mpNil:
		return "nil"
	case c == 0xc2 || c == 0xc3:
		return "a boolean"
	case c == 0xca || c == 0xcb:
		return "a float"
	case c >= 0x80 && c <= 0x8f, c == 0xde, c == 0xdf:
		return "a map"
	case c >= 0x90 && c <= 0x9f, c == 0xdc, c == 0xdd:
		return "an array"
	case c >= 0xa0 && c <= 0xbf, c >= 0xd9 && c <= 0xdb:
		return "a string"
	case c >= 0xc4 && c <= 0xc6:
		return "binary"
	}
	return fmt.Sprintf("type 0x%02x", c)
}
