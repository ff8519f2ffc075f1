// Package source reads items from backing storage, the slow tier Stallfree
// exists to hide. Every read goes through a manifest taken at registration, so
// no request can name an object the manifest does not hold.
package source

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"unicode/utf8"
)

// MaxItemSize bounds one item; items are read whole into memory.
const MaxItemSize = 256 << 20

var (
	// ErrBadKey means a key is not a clean relative path.
	ErrBadKey = errors.New("invalid key")
	// ErrChanged means the object no longer matches the manifest.
	ErrChanged = errors.New("object changed since registration")
	// ErrDenied means storage refused the credentials (S3 403).
	ErrDenied = errors.New("storage denied access")
	// ErrNotFound means the bucket or directory does not exist.
	ErrNotFound = errors.New("no such bucket")
	// ErrUnavailable means storage failed after retries (5xx, connection).
	ErrUnavailable = errors.New("storage unavailable")
	// ErrCorrupt means a shard is not a readable tar archive.
	ErrCorrupt = errors.New("corrupt shard")
)

// Entry is one manifest line.
type Entry struct {
	Key  string
	Size int64
	// Tag fingerprints the object's version where the storage has one (a
	// hash of an S3 ETag), 0 where it has none (directories: size only).
	// A read whose object no longer carries it fails with ErrChanged.
	Tag uint64
	// Shard, ShardSize and Offset place a member of a tar shard: its bytes
	// are Size bytes at Offset in the shard object Shard of ShardSize bytes
	// (Tag is then the shard's). Empty Shard: the entry is a whole object.
	Shard     string
	ShardSize int64
	Offset    int64
}

// Source is backing storage. Implementations are safe for concurrent use.
type Source interface {
	// List returns every object, sorted bytewise by key.
	List(ctx context.Context) ([]Entry, error)
	// Read returns the object's bytes, which must be exactly e.Size long
	// and, where e.Tag is set, of that version. They are read into buf when
	// it has room for them (buf[:e.Size] is returned), so that callers can
	// recycle buffers; a nil buf is allocated.
	Read(ctx context.Context, e Entry, buf []byte) ([]byte, error)
	Close() error
}

// Options tune how a source is opened.
type Options struct {
	// BytesPerSecond throttles directory reads (0 = unlimited), to simulate
	// slow storage.
	BytesPerSecond int64
	S3             S3Config
	// Progress, when set, counts a listing as it goes (for a progress bar
	// while a large dataset registers).
	Progress *Progress
}

// Progress is how far a listing has got. Counters only grow.
type Progress struct {
	Listed     atomic.Int64 // objects listed (for tar sources, members indexed)
	Shards     atomic.Int64 // tar shards to index; 0 until they are listed
	ShardsDone atomic.Int64 // tar shards indexed
	ShardBytes atomic.Int64 // bytes of the shards indexed
}

// progressOf is opt's progress, or one nobody reads.
func progressOf(opt Options) *Progress {
	if opt.Progress != nil {
		return opt.Progress
	}
	return &Progress{}
}

// Normalize turns a user's source spec into the canonical form stored in the
// catalog: "dir:///abs/path" (a plain path is taken as a directory) or
// "s3://BUCKET" / "s3://BUCKET/PREFIX" (no trailing "/"), either of them
// behind "tar+" for a dataset of tar shards.
func Normalize(spec string) (string, error) {
	if strings.ContainsRune(spec, 0) || !utf8.ValidString(spec) {
		return "", fmt.Errorf("source %q: invalid characters", spec)
	}
	if rest, ok := strings.CutPrefix(spec, tarScheme); ok {
		if !strings.HasPrefix(rest, "dir://") && !strings.HasPrefix(rest, "s3://") {
			return "", fmt.Errorf("source %q: want tar+dir:///abs/path or tar+s3://BUCKET[/PREFIX]", spec)
		}
		norm, err := Normalize(rest)
		if err != nil {
			return "", err
		}
		return tarScheme + norm, nil
	}
	if rest, ok := strings.CutPrefix(spec, "s3://"); ok {
		return normalizeS3(spec, rest)
	}
	path := spec
	if rest, ok := strings.CutPrefix(spec, "dir://"); ok {
		path = rest
		if !filepath.IsAbs(path) {
			return "", fmt.Errorf("source %q: dir:// needs an absolute path (dir:///abs/path)", spec)
		}
	} else if strings.Contains(spec, "://") {
		return "", fmt.Errorf("source %q: unsupported scheme (want dir://, s3://, tar+dir://, tar+s3:// or a path)", spec)
	}
	if path == "" {
		return "", fmt.Errorf("source: empty path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return "", fmt.Errorf("source %q: %w", spec, err)
	}
	return "dir://" + abs, nil
}

// normalizeS3 checks a bucket name (S3's rules: 3-63 characters, lowercase
// letters, digits, dots and hyphens) and a prefix (a key, or nothing).
func normalizeS3(spec, rest string) (string, error) {
	bucket, prefix, _ := strings.Cut(rest, "/")
	prefix = strings.TrimSuffix(prefix, "/")
	if len(bucket) < 3 || len(bucket) > 63 || strings.Trim(bucket, "abcdefghijklmnopqrstuvwxyz0123456789.-") != "" ||
		strings.Trim(bucket[:1]+bucket[len(bucket)-1:], "abcdefghijklmnopqrstuvwxyz0123456789") != "" {
		return "", fmt.Errorf("source %q: %q is not a bucket name", spec, bucket)
	}
	if prefix == "" {
		return "s3://" + bucket, nil
	}
	if err := ValidKey(prefix); err != nil {
		return "", fmt.Errorf("source %q: prefix: %w", spec, err)
	}
	return "s3://" + bucket + "/" + prefix, nil
}

// Resolve is the storage a spec reads, normalized, with every symlink in its
// path followed: what an allow-list must be checked against, since the source
// is opened through them. The path must exist. An S3 spec is its normalized
// self; a tar spec resolves to the storage holding its shards.
func Resolve(spec string) (string, error) {
	norm, err := Normalize(spec)
	if err != nil {
		return "", err
	}
	norm = strings.TrimPrefix(norm, tarScheme)
	if strings.HasPrefix(norm, "s3://") {
		return norm, nil
	}
	real, err := filepath.EvalSymlinks(strings.TrimPrefix(norm, "dir://"))
	if err != nil {
		return "", fmt.Errorf("source %s: %w", norm, err)
	}
	return "dir://" + real, nil
}

// Where is where an opened source really is, as Resolve says it ("dir://"
// and the directory opened, symlinks resolved); false for S3, which has no
// symlinks.
func Where(src Source) (string, bool) {
	switch s := src.(type) {
	case *Dir:
		return s.Where(), true
	case *Tar:
		return s.Where()
	}
	return "", false
}

// Within reports whether a resolved spec lies at or below a resolved prefix.
func Within(spec, prefix string) bool {
	return spec == prefix || strings.HasPrefix(spec, strings.TrimSuffix(prefix, "/")+"/")
}

// Open opens a normalized or plain source spec.
func Open(spec string, opt Options) (Source, error) {
	norm, err := Normalize(spec)
	if err != nil {
		return nil, err
	}
	if rest, ok := strings.CutPrefix(norm, tarScheme); ok {
		st, err := openShards(rest, opt)
		if err != nil {
			return nil, err
		}
		// The tar source counts members, not the shard objects listed.
		return &Tar{shards: st, spec: norm, progress: progressOf(opt)}, nil
	}
	if strings.HasPrefix(norm, "s3://") {
		return openS3(norm, opt)
	}
	return OpenDir(strings.TrimPrefix(norm, "dir://"), opt)
}

// ValidKey reports whether key is a clean relative path: valid UTF-8, no NUL
// or other control characters, no leading "/", no empty, "." or ".." segments. Both the HTTP API and the
// directory walker use it, so a key that can be listed can be requested.
func ValidKey(key string) error {
	if key == "" || len(key) > 4096 {
		return fmt.Errorf("%w: empty or longer than 4096 bytes", ErrBadKey)
	}
	if !utf8.ValidString(key) {
		return fmt.Errorf("%w: not valid UTF-8", ErrBadKey)
	}
	if strings.IndexByte(key, 0) >= 0 {
		return fmt.Errorf("%w: contains NUL", ErrBadKey)
	}
	// Control characters could split the X-Key response header; files named
	// with them are left out of manifests.
	if strings.IndexFunc(key, isControl) >= 0 {
		return fmt.Errorf("%w: contains a control character", ErrBadKey)
	}
	if key[0] == '/' {
		return fmt.Errorf("%w: absolute path", ErrBadKey)
	}
	for seg := range strings.SplitSeq(key, "/") {
		switch seg {
		case "":
			return fmt.Errorf("%w: empty path segment", ErrBadKey)
		case ".", "..":
			return fmt.Errorf("%w: %q segment", ErrBadKey, seg)
		}
	}
	return nil
}

// isControl reports whether r is an ASCII control character.
func isControl(r rune) bool {
	return r < 0x20 || r == 0x7f
}
