package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cespare/xxhash/v2"
	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
	"golang.org/x/sync/errgroup"
)

// S3Config is how a node reaches S3-compatible storage.
type S3Config struct {
	// Endpoint is a URL (http:// or https://); empty means AWS. An explicit
	// endpoint is addressed path-style (MinIO, Ceph and most others need it).
	Endpoint string
	Region   string // default us-east-1
	// CredentialsFile is a shared AWS credentials file, read with Profile
	// (default "default"). Without one, Env supplies AWS_ACCESS_KEY_ID,
	// AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN; with neither, requests
	// are anonymous.
	CredentialsFile, Profile string
	Env                      func(string) string
	// Listers bounds the listings that run at once when a registration splits
	// a prefix by its common prefixes (default 16).
	Listers int
}

// S3 serves the objects below a bucket prefix. Keys are object keys with
// the prefix and its "/" removed.
type S3 struct {
	core   minio.Core
	bucket string
	prefix string // "" or ending in "/"
	cfg    S3Config
	listed *atomic.Int64
	// leftOut counts what the last listing left out: keys that cannot be
	// keys, objects over the size bound (directory markers are no items).
	leftOut atomic.Int64
}

// LeftOut is how many objects the last List left out (keys that cannot be
// keys, objects over MaxItemSize): they were dropped without a word before.
func (s *S3) LeftOut() int { return int(s.leftOut.Load()) }

// openS3 opens s3://BUCKET/PREFIX (normalized).
func openS3(norm string, opt Options) (*S3, error) {
	cfg := opt.S3
	bucket, prefix, _ := strings.Cut(strings.TrimPrefix(norm, "s3://"), "/")
	if prefix != "" {
		prefix += "/"
	}
	host, secure := "s3.amazonaws.com", true
	lookup := minio.BucketLookupAuto
	if cfg.Endpoint != "" {
		u, err := url.Parse(cfg.Endpoint)
		if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
			return nil, fmt.Errorf("--s3-endpoint %q: want http://HOST[:PORT] or https://HOST[:PORT]", cfg.Endpoint)
		}
		host, secure, lookup = u.Host, u.Scheme == "https", minio.BucketLookupPath
	}
	region := cfg.Region
	if region == "" {
		region = "us-east-1"
	}
	tr, err := minio.DefaultTransport(secure)
	if err != nil {
		return nil, err
	}
	// Every node reads in parallel from one endpoint: keep connections.
	tr.MaxIdleConnsPerHost = 256
	c, err := minio.NewCore(host, &minio.Options{Creds: cfg.credentials(), Secure: secure, Region: region,
		BucketLookup: lookup, Transport: tr})
	if err != nil {
		return nil, fmt.Errorf("s3 client: %w", err)
	}
	return &S3{core: *c, bucket: bucket, prefix: prefix, cfg: cfg, listed: &progressOf(opt).Listed}, nil
}

func (c S3Config) credentials() *credentials.Credentials {
	if c.CredentialsFile != "" {
		profile := c.Profile
		if profile == "" {
			profile = "default"
		}
		return credentials.NewFileAWSCredentials(c.CredentialsFile, profile)
	}
	env := c.Env
	if env == nil {
		env = func(string) string { return "" }
	}
	return credentials.NewStaticV4(env("AWS_ACCESS_KEY_ID"), env("AWS_SECRET_ACCESS_KEY"), env("AWS_SESSION_TOKEN"))
}

// Close has nothing to release: connections belong to the HTTP transport.
func (s *S3) Close() error { return nil }

// etagTag turns an ETag into a manifest tag (never 0: 0 means "untagged").
func etagTag(etag string) uint64 {
	return max(xxhash.Sum64String(strings.Trim(etag, `"`)), 1)
}

// List lists the prefix. A flat listing of millions of keys is one request
// per 1000 keys in a row; the first level of "directories" under the prefix
// is listed first and each is then listed on its own, several at once.
func (s *S3) List(ctx context.Context) ([]Entry, error) { return s.list(ctx, MaxItemSize) }

// list lists objects of at most maxSize bytes (larger ones are left out).
func (s *S3) list(ctx context.Context, maxSize int64) ([]Entry, error) {
	s.leftOut.Store(0)
	var out []Entry
	var subs []string
	keys, prefixes := once{}, once{}
	for o := range s.core.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix}) {
		if o.Err != nil {
			return nil, s.storageErr("list", s.prefix, o.Err)
		}
		if strings.HasSuffix(o.Key, "/") && o.ETag == "" { // a common prefix
			if err := prefixes.next(s.bucket, o.Key); err != nil {
				return nil, err
			}
			subs = append(subs, o.Key)
			continue
		}
		if err := keys.next(s.bucket, o.Key); err != nil {
			return nil, err
		}
		if e, ok := s.entry(o, maxSize); ok {
			out = append(out, e)
			s.listed.Add(1)
		}
	}
	listers := s.cfg.Listers
	if listers <= 0 {
		listers = 16
	}
	var mu sync.Mutex
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listers)
	for _, p := range subs {
		g.Go(func() error {
			var part []Entry
			keys := once{}
			for o := range s.core.ListObjectsIter(gctx, s.bucket, minio.ListObjectsOptions{Prefix: p, Recursive: true}) {
				if o.Err != nil {
					return s.storageErr("list", p, o.Err)
				}
				if err := keys.next(s.bucket, o.Key); err != nil {
					return err
				}
				if e, ok := s.entry(o, maxSize); ok {
					part = append(part, e)
					s.listed.Add(1)
				}
			}
			mu.Lock()
			out = append(out, part...)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	for i := 1; i < len(out); i++ {
		// One key listed flat and again under its prefix: the server's
		// listings disagree, and a manifest's keys name one item each.
		if out[i].Key == out[i-1].Key {
			return nil, fmt.Errorf("list s3://%s/%s: %w: %q listed twice", s.bucket, s.prefix, ErrUnavailable, out[i].Key)
		}
	}
	return out, nil
}

// once checks that a listing names each key once. A server that repeats a
// page (the same continuation token forever) would otherwise be listed
// without end, the heap growing with every page (18 MB to 987 MB in 87 s),
// and one that repeats a key would give a manifest the same key twice.
// (Not an order check: S3 Express directory buckets and servers that walk a
// file tree list keys out of byte order.)
type once map[string]struct{}

func (o once) next(bucket, key string) error {
	if _, again := o[key]; again {
		return fmt.Errorf("list s3://%s: %w: %q listed twice (the listing repeats itself)", bucket, ErrUnavailable, key)
	}
	o[key] = struct{}{}
	return nil
}

// entry turns a listed object into a manifest line, leaving out what cannot
// be a key (directory markers, "a//b", ".." segments, control characters).
func (s *S3) entry(o minio.ObjectInfo, maxSize int64) (Entry, bool) {
	key := strings.TrimPrefix(o.Key, s.prefix)
	if ValidKey(key) != nil || o.Size < 0 || o.Size > maxSize {
		if !strings.HasSuffix(o.Key, "/") {
			s.leftOut.Add(1)
		}
		return Entry{}, false
	}
	return Entry{Key: key, Size: o.Size, Tag: etagTag(o.ETag)}, true
}

// Read GETs the object and checks that it is still the version listed.
func (s *S3) Read(ctx context.Context, e Entry, buf []byte) ([]byte, error) {
	if err := ValidKey(e.Key); err != nil {
		return nil, err
	}
	if e.Size < 0 || e.Size > MaxItemSize {
		return nil, fmt.Errorf("read %s: size %d out of range", e.Key, e.Size)
	}
	body, info, _, err := s.core.GetObject(ctx, s.bucket, s.prefix+e.Key, minio.GetObjectOptions{})
	if err != nil {
		return nil, s.storageErr("read", s.prefix+e.Key, err)
	}
	defer body.Close()
	if info.Size != e.Size || (e.Tag != 0 && etagTag(info.ETag) != e.Tag) {
		return nil, fmt.Errorf("read %s: %w (size %d, listed %d; or a new ETag)", e.Key, ErrChanged, info.Size, e.Size)
	}
	if int64(cap(buf)) < e.Size {
		buf = make([]byte, e.Size)
	}
	buf = buf[:e.Size]
	if _, err := io.ReadFull(body, buf); err != nil {
		return nil, s.storageErr("read", s.prefix+e.Key, err)
	}
	return buf, nil
}

// readAt is a ranged GET of len(buf) bytes at off of a shard, which must
// still be the version indexed.
func (s *S3) readAt(ctx context.Context, shard Entry, off int64, buf []byte) error {
	if len(buf) == 0 {
		return nil
	}
	var opts minio.GetObjectOptions
	if err := opts.SetRange(off, off+int64(len(buf))-1); err != nil {
		return fmt.Errorf("read %s: %w", shard.Key, err)
	}
	body, info, hdr, err := s.getShard(ctx, shard, opts)
	if err != nil {
		return err
	}
	defer body.Close()
	// A server may answer a range with the whole object (200: RFC 9110
	// lets it ignore Range) or with another range: bytes read from it as
	// this one's were served as the member (the shard's own tar header as
	// a JPEG), and kept.
	want := fmt.Sprintf("bytes %d-%d/%d", off, off+int64(len(buf))-1, shard.Size)
	if got := hdr.Get("Content-Range"); info.Size != int64(len(buf)) || got != want {
		if total, ok := rangeTotal(got); ok && total != shard.Size {
			return fmt.Errorf("read %s: %w (%d bytes, indexed %d)", shard.Key, ErrChanged, total, shard.Size)
		}
		return fmt.Errorf("read %s: %w: asked for %s, answered %d bytes of %q", shard.Key, ErrUnavailable, want, info.Size, got)
	}
	if _, err := io.ReadFull(body, buf); err != nil {
		return s.storageErr("read", s.prefix+shard.Key, err)
	}
	return nil
}

// stream is one GET of a whole shard, for a sequential pass.
func (s *S3) stream(ctx context.Context, shard Entry) (io.ReadCloser, error) {
	return s.open(ctx, shard)
}

// open streams a whole shard (one GET) for indexing: exactly its listed
// size, or an error (a body of another length is another object).
func (s *S3) open(ctx context.Context, shard Entry) (io.ReadCloser, error) {
	body, info, _, err := s.getShard(ctx, shard, minio.GetObjectOptions{})
	if err != nil {
		return nil, err
	}
	if info.Size != shard.Size {
		body.Close()
		return nil, fmt.Errorf("read %s: %w (%d bytes, listed %d)", shard.Key, ErrChanged, info.Size, shard.Size)
	}
	return body, nil
}

// getShard is a GET of a shard (or a range of it) that must still be the
// version indexed.
func (s *S3) getShard(ctx context.Context, shard Entry, opts minio.GetObjectOptions) (io.ReadCloser, minio.ObjectInfo, http.Header, error) {
	body, info, hdr, err := s.core.GetObject(ctx, s.bucket, s.prefix+shard.Key, opts)
	if err != nil {
		return nil, info, nil, s.storageErr("read", s.prefix+shard.Key, err)
	}
	if shard.Tag != 0 && etagTag(info.ETag) != shard.Tag {
		body.Close()
		return nil, info, nil, fmt.Errorf("read %s: %w (a new ETag)", shard.Key, ErrChanged)
	}
	return body, info, hdr, nil
}

// rangeTotal is the object's size a Content-Range names ("bytes a-b/N").
func rangeTotal(contentRange string) (int64, bool) {
	_, total, ok := strings.Cut(contentRange, "/")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseInt(total, 10, 64)
	return n, err == nil
}

// storageErr sorts an S3 failure into the kinds the API answers for.
// minio-go has already retried what is worth retrying (5xx, throttling,
// connection errors) with backoff, within the caller's deadline.
// object is the full object key (or key prefix) the operation was on.
func (s *S3) storageErr(op, object string, err error) error {
	where := fmt.Sprintf("%s s3://%s/%s", op, s.bucket, object)
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", where, err)
	}
	return fmt.Errorf("%s: %w: %w", where, errorKind(minio.ToErrorResponse(err)), err)
}

// errorKind is what S3's answer means to a caller. (An if chain: Go's
// coverage gives a tagless switch's case expressions no block, so mutation
// testing could not tell whether a test reaches them.)
func errorKind(resp minio.ErrorResponse) error {
	if resp.Code == "AccessDenied" || resp.Code == "InvalidAccessKeyId" || resp.Code == "SignatureDoesNotMatch" ||
		resp.StatusCode == http.StatusForbidden {
		return ErrDenied
	}
	if resp.Code == "NoSuchBucket" {
		return ErrNotFound
	}
	if resp.Code == "NoSuchKey" {
		return ErrChanged // listed at registration, gone now
	}
	return ErrUnavailable
}
