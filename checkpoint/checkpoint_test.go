package checkpoint

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"

	"stallfree/catalog"
)

func TestPartner(t *testing.T) {
	cases := []struct {
		members []string
		want    map[string]string
	}{
		{[]string{"a", "b", "c", "d"}, map[string]string{"a": "b", "b": "a", "c": "d", "d": "c"}},
		{[]string{"a", "b", "c"}, map[string]string{"a": "b", "b": "c", "c": "a"}},
		{[]string{"a", "b", "c", "d", "e"}, map[string]string{"a": "b", "b": "a", "c": "d", "d": "e", "e": "c"}},
		{[]string{"a", "b"}, map[string]string{"a": "b", "b": "a"}},
	}
	for _, c := range cases {
		for self, want := range c.want {
			if got, ok := Partner(c.members, self); !ok || got != want {
				t.Errorf("Partner(%v, %s) = %q, %v; want %s", c.members, self, got, ok, want)
			}
			g := Group(c.members, self)
			if !contains(g, self) || !contains(g, want) {
				t.Errorf("Group(%v, %s) = %v: want both %s and its partner %s", c.members, self, g, self, want)
			}
		}
	}
	if p, ok := Partner([]string{"a"}, "a"); ok {
		t.Errorf("a lone node has partner %q", p)
	}
	if p, ok := Partner([]string{"a", "b"}, "x"); ok {
		t.Errorf("a non-member has partner %q", p)
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestMemoryBudget(t *testing.T) {
	m := newMemory(100 + 2*partOverhead) // 100 bytes for two parts
	b, err := m.reserve(60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.reserve(41); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("reserve past the budget: %v", err)
	}
	copy(b, "hello")
	k := partKey{"n", 1, "0"}
	if err := m.store(k, b, "sum", func(partKey) (string, bool) { return "", false }); err != nil {
		t.Fatal(err)
	}
	h, ok := m.get(k)
	if !ok || string(h.data[:5]) != "hello" {
		t.Fatal("stored part not found")
	}
	m.drop(func(partKey) bool { return true })
	if used, parts := m.usage(); used != 60 || parts != 0 {
		t.Fatalf("a dropped part still read: used %d (want 60 until released), parts %d", used, parts)
	}
	h.release()
	if used, _ := m.usage(); used != 0 {
		t.Fatalf("used %d after the last reader let go", used)
	}
}

// Parts of no bytes are charged their bookkeeping: uploads under ever new
// names, never committed, stop at the budget instead of growing the heap.
// Dropping one makes room for one more.
func TestEveryPartIsChargedItsBookkeeping(t *testing.T) {
	m := newMemory(3 * partOverhead)
	defer m.dropAll()
	notSettled := func(partKey) (string, bool) { return "", false }
	for i := range 3 {
		b, err := m.reserve(0)
		if err != nil {
			t.Fatalf("part %d of 3: %v", i, err)
		}
		if err := m.store(partKey{"n", uint64(i), "0"}, b, "empty", notSettled); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := m.reserve(0); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("a fourth empty part in a budget of three: %v", err)
	}
	if used, parts := m.usage(); used != 0 || parts != 3 {
		t.Fatalf("usage %d bytes, %d parts; want 0 bytes in 3 parts", used, parts)
	}
	m.drop(func(k partKey) bool { return k.step == 1 })
	if _, err := m.reserve(0); err != nil {
		t.Fatalf("after a drop: %v", err)
	}
	if _, err := m.reserve(0); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("a part past a full budget again: %v", err)
	}
}

// fakeCatalog knows no committed step.
type fakeCatalog struct{ Catalog }

func (fakeCatalog) Checkpoint(string) (*catalog.Checkpoint, bool) { return nil, false }

func sum(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

func TestPutStoresOnlyWholeCheckedParts(t *testing.T) {
	s := &Service{cfg: Config{Self: "a"}, cat: fakeCatalog{}, mem: newMemory(1 << 20)}
	body := bytes.Repeat([]byte("0123456789"), 10_000)
	req := PutRequest{Name: "job", Step: 1, Part: "0", Sum: sum(body), Size: int64(len(body)), Replica: true}
	ctx := context.Background()

	cut := iotest.TimeoutReader(io.LimitReader(bytes.NewReader(body), 4096)) // ends early
	if err := s.Put(ctx, req, io.MultiReader(cut)); !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "cut off") {
		t.Fatalf("a cut body: %v", err)
	}
	bad := req
	bad.Sum = sum([]byte("other"))
	if err := s.Put(ctx, bad, bytes.NewReader(body)); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a wrong sum: %v", err)
	}
	big := req
	big.Size = 2 << 20
	if err := s.Put(ctx, big, bytes.NewReader(body)); !errors.Is(err, ErrNoRoom) {
		t.Fatalf("a part beyond the budget: %v", err)
	}
	if used, parts := s.mem.usage(); used != 0 || parts != 0 {
		t.Fatalf("refused parts left %d bytes, %d parts", used, parts)
	}
	if err := s.Put(ctx, req, iotest.OneByteReader(bytes.NewReader(body))); err != nil {
		t.Fatal(err)
	}
	p, err := s.Open(ctx, "job", 1, "0", true)
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(p)
	p.Close()
	if !bytes.Equal(got, body) || p.Sum != req.Sum {
		t.Fatal("stored part differs")
	}
	for _, name := range []string{"", "../x", ".hidden", "a/b", strings.Repeat("x", 129)} {
		r := req
		r.Part = name
		if err := s.Put(ctx, r, bytes.NewReader(body)); !errors.Is(err, ErrBadRequest) {
			t.Errorf("part %q: %v", name, err)
		}
	}
}

func TestVerifierFailsTheLastRead(t *testing.T) {
	body := []byte("some checkpoint bytes")
	v := newVerifier(io.NopCloser(bytes.NewReader(body)), int64(len(body)), sum([]byte("other")))
	got, err := io.ReadAll(v)
	if !errors.Is(err, errSum) || len(got) == len(body) {
		t.Fatalf("read %d of %d bytes, err %v: want the last read refused", len(got), len(body), err)
	}
	v = newVerifier(io.NopCloser(bytes.NewReader(body)), int64(len(body)), sum(body))
	if got, err := io.ReadAll(v); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("a right sum: %v", err)
	}
}
