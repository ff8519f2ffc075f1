package httpapi

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"runtime"
	"strings"
	"testing"
	"unsafe"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"

	"stallfree/api"
)

// The batch-write reader is held to the msgpack library's decoding, which
// it replaced (referenceItemWrites): whatever it accepts, the library reads
// as the same items; whatever the library accepts, written out plainly (maps
// with binary data, as every client sends), it accepts alike.

// referenceItemWrites is the library decoding the batch-write reader
// replaced, kept as the reference it must agree with.
func referenceItemWrites(body []byte) (items []api.ItemWrite, err error) {
	// The library panics on some bodies (an "index" given twice, the
	// second into the first's value): the reader refuses those.
	defer func() {
		if p := recover(); p != nil {
			items, err = nil, fmt.Errorf("the library panicked: %v", p)
		}
	}()
	type itemWire struct {
		Index any     `msgpack:"index"`
		Data  *[]byte `msgpack:"data"`
	}
	// The library allocates an array's declared count before reading an
	// element (a 5-byte body asked for 32 GiB): a body with a count past
	// what is left of it is refused first, as the reader refuses it.
	if br := bytes.NewReader(body); countsWithin(msgpack.NewDecoder(br), br) != nil {
		return nil, errors.New("a count past the body")
	}
	r := bytes.NewReader(body)
	dec := msgpack.NewDecoder(r)
	dec.DisallowUnknownFields(true)
	var wire []*itemWire
	if err := dec.Decode(&wire); err != nil {
		return nil, err
	}
	if r.Len() > 0 {
		return nil, fmt.Errorf("%d bytes after the array", r.Len())
	}
	items = make([]api.ItemWrite, len(wire))
	for j, w := range wire {
		if w == nil || w.Data == nil {
			return nil, fmt.Errorf("element %d: nil or no data", j)
		}
		x := reflect.ValueOf(w.Index)
		switch {
		case w.Index == nil:
			return nil, errors.New("no index")
		case x.CanInt() && x.Int() >= math.MinInt && x.Int() <= math.MaxInt:
			items[j] = api.ItemWrite{Index: int(x.Int()), Data: *w.Data}
		case x.CanUint() && x.Uint() <= math.MaxInt:
			items[j] = api.ItemWrite{Index: int(x.Uint()), Data: *w.Data}
		default:
			return nil, fmt.Errorf("element %d: index %v", j, w.Index)
		}
	}
	return items, nil
}

// countsWithin walks the value d reads from r (read unbuffered: a
// bytes.Reader is a byte scanner) and fails at a container whose count
// exceeds the bytes left, before the library could allocate it.
func countsWithin(d *msgpack.Decoder, r *bytes.Reader) error {
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	n := 0
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err = d.DecodeArrayLen()
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err = d.DecodeMapLen()
		n *= 2
	default:
		return d.Skip()
	}
	if err != nil {
		return err
	}
	if n > r.Len() {
		return fmt.Errorf("a count of %d in %d bytes", n, r.Len())
	}
	for range n {
		if err := countsWithin(d, r); err != nil {
			return err
		}
	}
	return nil
}

func sameItems(a, b []api.ItemWrite) bool {
	if len(a) != len(b) {
		return false
	}
	for j := range a {
		if a[j].Index != b[j].Index || !bytes.Equal(a[j].Data, b[j].Data) || (a[j].Data == nil) != (b[j].Data == nil) {
			return false
		}
	}
	return true
}

// itemWritesSeeds are bodies as clients write them, at every header width,
// and broken ones.
func itemWritesSeeds(t testing.TB) [][]byte {
	t.Helper()
	pack := func(v any) []byte {
		b, err := msgpack.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	big := bytes.Repeat([]byte{7}, 70000) // bin32
	mid := bytes.Repeat([]byte{5}, 300)   // bin16
	many := make([]api.ItemWrite, 20)     // array16
	for j := range many {
		many[j] = api.ItemWrite{Index: j * 1000, Data: []byte{byte(j)}}
	}
	seeds := [][]byte{
		pack([]api.ItemWrite{{Index: 3, Data: []byte("abc")}}),
		pack([]api.ItemWrite{{Index: 1 << 40, Data: big}, {Index: 200, Data: mid}, {Index: 0, Data: []byte{}}}),
		pack(many),
		pack([]map[string]any{{"data": []byte("x"), "index": int8(-3)}}), // keys the other way round, a negative index
		pack([]map[string]any{{"index": uint16(40000), "data": []byte("y")}}),
		pack([]map[string]any{{"index": int64(-1 << 40), "data": []byte("y")}}),
		pack([]map[string]any{{"index": 1, "data": []byte("y"), "extra": 1}}),
		pack([]map[string]any{{"index": 1.5, "data": []byte("y")}}),
		pack([]map[string]any{{"index": nil, "data": []byte("y")}}),
		pack([]map[string]any{{"index": 1, "data": nil}, {"index": 2, "data": bytes.Repeat([]byte{9}, 20)}}),
		pack([]map[string]any{{"index": 1}, {"index": 2, "data": bytes.Repeat([]byte{9}, 20)}}), // padded: a body too short for two elements is refused as such
		pack([]any{nil, map[string]any{"index": 2, "data": bytes.Repeat([]byte{9}, 20)}}),
		pack([]any{}),
		pack(nil),
		pack(map[string]any{"index": 1}),
		{0xdd, 0xff, 0xff, 0xff, 0xff},              // four billion elements in four bytes
		{0x91, 0x82, 0xa5, 'i', 'n', 'd', 'e', 'x'}, // cut short
	}
	withTail := append(pack([]api.ItemWrite{{Index: 1, Data: []byte("z")}}), 0)
	// Maps written out by hand: keys twice, data as a string, a key that is
	// no string.
	twiceIndex := []byte("\x91\x83\xa5index\x01\xa5index\x02\xa4data\xc4\x01z")
	twiceData := []byte("\x91\x83\xa5index\x01\xa4data\xc4\x01z\xa4data\xc4\x01y")
	strData := []byte("\x91\x82\xa5index\x01\xa4data\xa1z")
	intKey := []byte("\x91\x82\x01\x01\xa4data\xc4\x05zzzzz")
	return append(seeds, withTail, twiceIndex, twiceData, strData, intKey)
}

func FuzzDecodeItemWrites(f *testing.F) {
	for _, s := range itemWritesSeeds(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		got, err := decodeItemWrites(body, math.MaxInt)
		want, refErr := referenceItemWrites(body)
		if err == nil {
			if refErr != nil || !sameItems(got, want) {
				t.Fatalf("%x: read %+v; the library: %+v, %v", body, got, want, refErr)
			}
			for _, it := range got { // slices of the body, not copies
				if len(it.Data) > 0 && !within(it.Data, body) {
					t.Fatalf("%x: item %d's data is a copy", body, it.Index)
				}
			}
			return
		}
		if refErr != nil {
			return
		}
		plain, perr := msgpack.Marshal(want)
		if perr != nil {
			t.Fatal(perr)
		}
		if got, err := decodeItemWrites(plain, math.MaxInt); err != nil || !sameItems(got, want) {
			t.Fatalf("%x, as a client writes it (%x): %+v, %v; the library: %+v", body, plain, got, err, want)
		}
	})
}

// within reports whether p lies inside b's memory.
func within(p, b []byte) bool {
	lo, hi := uintptr(unsafe.Pointer(unsafe.SliceData(b))), uintptr(unsafe.Pointer(unsafe.SliceData(b)))+uintptr(len(b))
	at := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	return at >= lo && at+uintptr(len(p)) <= hi
}

// The seeds run as a test too, with what each must give: the items for a
// well-formed body, a message naming the fault for a broken one.
func TestDecodeItemWrites(t *testing.T) {
	seeds := itemWritesSeeds(t)
	want := []string{
		"", "", "", "", "", "",
		`element 0: unknown field "extra"`,
		`element 0: "index": a float is not an integer`,
		`element 0: "index": missing`,
		`element 0: no "data" (binary)`,
		`element 0: no "data" (binary)`,
		"element 0: nil, not a map",
		"",
		"want an array, found nil",
		"want an array, found a map",
		"an array of 4294967295 in the 0 bytes left",
		"an array of 1 maps in the 7 bytes left (each takes 15 at least)",
		"1 bytes after the array",
		`element 0: "index" twice`,
		`element 0: "data" twice`,
		`element 0: "data": want binary, found a string`,
		"element 0: a key: want a string, found an integer",
	}
	if len(seeds) != len(want) {
		t.Fatalf("%d seeds, %d outcomes", len(seeds), len(want))
	}
	for i, body := range seeds {
		got, err := decodeItemWrites(body, math.MaxInt)
		if want[i] == "" {
			ref, refErr := referenceItemWrites(body)
			if err != nil || refErr != nil || !sameItems(got, ref) {
				t.Errorf("seed %d: %+v, %v; the library: %+v, %v", i, got, err, ref, refErr)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want[i]) {
			t.Errorf("seed %d: error %v, want %q", i, err, want[i])
		}
	}
	// Every integer width reads back, at its bounds.
	for _, index := range []any{int8(-128), int16(-32768), int32(math.MinInt32), int64(math.MinInt64), uint8(255), uint16(65535), uint32(math.MaxUint32), uint64(math.MaxInt64), 127, -32} {
		body, _ := msgpack.Marshal([]map[string]any{{"index": index, "data": []byte{1}}})
		got, err := decodeItemWrites(body, math.MaxInt)
		if err != nil || fmt.Sprint(got[0].Index) != fmt.Sprint(index) {
			t.Errorf("index %v (%T): %+v, %v", index, index, got, err)
		}
	}
	body, _ := msgpack.Marshal([]map[string]any{{"index": uint64(math.MaxInt64) + 1, "data": []byte{1}}})
	if _, err := decodeItemWrites(body, math.MaxInt); err == nil || !strings.Contains(err.Error(), "out of range") {
		t.Errorf("an index past MaxInt64: %v", err)
	}
}

// A count that the body could not hold, or past the limit, is refused
// before the items are allocated: a slice of them costs 32 bytes an
// element, twice the smallest element's 15 bytes of body.
func TestItemWritesCountsBeforeAllocating(t *testing.T) {
	liar := make([]byte, 5+1<<20) // one MiB of zeros declared as 2^20 elements
	liar[0], liar[1], liar[2], liar[3], liar[4] = 0xdd, 0, 0x10, 0, 0
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err := decodeItemWrites(liar, math.MaxInt)
	runtime.ReadMemStats(&after)
	if err == nil || !strings.Contains(err.Error(), "an array of 1048576 maps in the 1048576 bytes left (each takes 15 at least)") {
		t.Fatalf("2^20 elements in 1 MiB: %v", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<10 {
		t.Fatalf("refusing it allocated %d bytes", grew)
	}
	three, _ := msgpack.Marshal([]api.ItemWrite{{Index: 1, Data: []byte("a")}, {Index: 2, Data: []byte("b")}, {Index: 3, Data: []byte("c")}})
	var tooMany errTooManyItems
	if _, err := decodeItemWrites(three, 2); !errors.As(err, &tooMany) || err.Error() != "3 items in one batch; the limit is 2" {
		t.Fatalf("three items, a limit of two: %v", err)
	}
	if items, err := decodeItemWrites(three, 3); err != nil || len(items) != 3 {
		t.Fatalf("three items, a limit of three: %v, %v", items, err)
	}
	exact := bytes.Repeat([]byte("\x82\xa5index\x00\xa4data\xc4\x00"), 3) // the smallest elements: 15 bytes each
	if items, err := decodeItemWrites(append([]byte{0x93}, exact...), 3); err != nil || len(items) != 3 || items[2].Data == nil {
		t.Fatalf("three elements of 15 bytes: %v, %v", items, err)
	}
}
