package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"hash"
	"hash/crc32"
	"strings"
)

// The checksum algorithms a part's X-Checksum may name (docs/api.md,
// "Checkpoint checksums"): crc32c costs a fraction of sha256's CPU per byte
// (SSE4.2 in Go's hash/crc32) and guards against what a checkpoint meets,
// torn and corrupted copies; sha256 stays for whoever wants a cryptographic
// digest.
const (
	AlgoCRC32C = "crc32c"
	AlgoSHA256 = "sha256"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// A Checksum is an X-Checksum value, parsed. Its canonical form (String)
// is what the catalog keeps and sends on: "crc32c:<8 hex>", or for sha256
// the bare 64 hex digits v3 used, so both spellings of one sha256 compare
// equal.
type Checksum struct {
	Algo  string
	Value string // lowercase hex
}

// ParseChecksum reads "crc32c:<8 lowercase hex>", "sha256:<64 lowercase
// hex>" or a bare 64-hex sha256.
func ParseChecksum(v string) (Checksum, error) {
	algo, val, found := strings.Cut(v, ":")
	if !found {
		algo, val = AlgoSHA256, v
	}
	want := map[string]int{AlgoCRC32C: 8, AlgoSHA256: 64}[algo]
	if want == 0 || len(val) != want || !lowerHex(val) {
		return Checksum{}, fmt.Errorf("%w: X-Checksum %q: want crc32c:<8 lowercase hex>, sha256:<64 lowercase hex> or a bare 64-hex sha256", ErrBadRequest, v)
	}
	return Checksum{Algo: algo, Value: val}, nil
}

func lowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// String is the canonical form.
func (c Checksum) String() string {
	if c.Algo == AlgoSHA256 {
		return c.Value
	}
	return c.Algo + ":" + c.Value
}

// New is a hash of the checksum's algorithm.
func (c Checksum) New() hash.Hash {
	if c.Algo == AlgoCRC32C {
		return crc32.New(castagnoli)
	}
	return sha256.New()
}

// Of is h's sum as a Checksum of c's algorithm.
func (c Checksum) Of(h hash.Hash) Checksum {
	return Checksum{Algo: c.Algo, Value: hex.EncodeToString(h.Sum(nil))}
}

// AlgoOf is the algorithm of a canonical sum ("" when it is none).
func AlgoOf(sum string) string {
	c, err := ParseChecksum(sum)
	if err != nil {
		return ""
	}
	return c.Algo
}
