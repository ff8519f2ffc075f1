package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"testing"

	"stallfree/catalog"
)

func crc(b []byte) string { return fmt.Sprintf("crc32c:%08x", crc32.Checksum(b, castagnoli)) }

func TestParseChecksum(t *testing.T) {
	body := []byte("checkpoint")
	for v, want := range map[string]Checksum{
		crc(body):             {AlgoCRC32C, crc(body)[7:]},
		"sha256:" + sum(body): {AlgoSHA256, sum(body)},
		sum(body):             {AlgoSHA256, sum(body)},
	} {
		got, err := ParseChecksum(v)
		if err != nil || got != want {
			t.Errorf("ParseChecksum(%q) = %+v, %v; want %+v", v, got, err, want)
		}
	}
	if c, _ := ParseChecksum("sha256:" + sum(body)); c.String() != sum(body) {
		t.Errorf("a prefixed sha256 is kept as %q; want the bare form", c.String())
	}
	for _, bad := range []string{"", "crc32c:", "crc32c:0123456", "crc32c:0123456789", "crc32c:ABCDEF01", "crc32c:0123456g",
		"sha256:" + sum(body)[:63], "md5:" + sum(body)[:32], "CRC32C:01234567", sum(body) + "0", "sha256:" + sum(body) + ":x"} {
		if _, err := ParseChecksum(bad); !errors.Is(err, ErrBadRequest) {
			t.Errorf("ParseChecksum(%q): %v; want a bad request", bad, err)
		}
	}
}

// Each form stores a part whose body matches it, and refuses (storing
// nothing) one that does not; the partner's copy is checked with the same
// algorithm, and the listing names it per part.
func TestChecksumFormsStoreOnlyMatchingBodies(t *testing.T) {
	cat := &stepCatalog{}
	s := newTestService(t, cat)
	body := bytes.Repeat([]byte("weights"), 10_000)
	other := append(bytes.Clone(body[:len(body)-1]), 'X')
	for i, form := range []func([]byte) string{crc, sum, func(b []byte) string { return "sha256:" + sum(b) }} {
		part := fmt.Sprint(i)
		req := PutRequest{Name: "job", Step: 1, Part: part, Sum: form(body), Size: int64(len(body)), Replica: true}
		if err := s.Put(bounded(t), req, bytes.NewReader(other)); !errors.Is(err, ErrBadRequest) {
			t.Fatalf("%s with other bytes: %v", req.Sum, err)
		}
		if _, parts := s.mem.usage(); parts != i {
			t.Fatalf("%s: a mismatched body was stored", req.Sum)
		}
		if err := s.Put(bounded(t), req, bytes.NewReader(body)); err != nil {
			t.Fatalf("%s: %v", req.Sum, err)
		}
		p, err := s.Open(context.Background(), "job", 1, part, true)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(newVerifier(p, p.Size, p.Sum))
		p.Close()
		if !bytes.Equal(got, body) {
			t.Fatalf("%s: read back %d bytes", req.Sum, len(got))
		}
	}
	cat.commit("job", 1,
		catalog.CheckpointPart{Name: "0", Size: int64(len(body)), Sum: crc(body), Holders: []string{"a"}},
		catalog.CheckpointPart{Name: "1", Size: int64(len(body)), Sum: sum(body), Holders: []string{"a"}})
	info, err := s.Get("job")
	if err != nil {
		t.Fatal(err)
	}
	cs := info.Steps[0].Checksums
	if len(cs) != 2 || cs[0].Part != "0" || cs[0].Checksum != "crc32c" || cs[1].Checksum != "sha256" {
		t.Fatalf("listing's checksums: %+v", cs)
	}
}
