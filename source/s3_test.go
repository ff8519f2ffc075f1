package source

import (
	"bytes"
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"stallfree/miniotest"
)

// s3Backend is an S3 endpoint the tests write objects into: the in-process
// fake (fakeS3, always) or a real MinIO server (the integration tier, built
// with -tags minio; make test runs both).
type s3Backend interface {
	url() string
	Bucket(name string)
	Put(bucket string, objects map[string][]byte)
	Remove(bucket, key string)
	// Stop and Restart take storage away and bring it back.
	Stop()
	Restart()
	// checksSecrets tells whether a wrong secret for a known key is refused
	// (the fake checks access keys only, not signatures).
	checksSecrets() bool
	// outage is how long a read is given while storage is down.
	outage() time.Duration
}

// forEachS3 runs test against the fake and, in the integration tier, MinIO.
func forEachS3(t *testing.T, test func(t *testing.T, srv s3Backend)) {
	t.Run("fake", func(t *testing.T) { test(t, startFakeS3(t, miniotest.User)) })
	if withMinIO {
		t.Run("minio", func(t *testing.T) { test(t, startMinIO(t)) })
	}
}

func s3Config(srv s3Backend, user, password string) S3Config {
	env := map[string]string{"AWS_ACCESS_KEY_ID": user, "AWS_SECRET_ACCESS_KEY": password}
	return S3Config{Endpoint: srv.url(), Env: func(k string) string { return env[k] }}
}

// objects is miniotest.Objects plus objects that must be left out of a
// manifest of prefix: a directory marker, a key with a control character,
// and objects outside the prefix.
func objects(prefix string, n int) (all map[string][]byte, want map[string][]byte) {
	all, want = miniotest.Objects(prefix, n)
	all[prefix+"marker/"] = nil
	all[prefix+"tab\there.bin"] = []byte("x")
	all["elsewhere/outside.bin"] = []byte("not below the prefix")
	all[prefix[:len(prefix)-1]+"-sibling/x.bin"] = []byte("a sibling prefix")
	return all, want
}

func TestS3ListsAndReadsAPrefix(t *testing.T) { forEachS3(t, testS3ListsAndReadsAPrefix) }

func testS3ListsAndReadsAPrefix(t *testing.T, srv s3Backend) {
	srv.Bucket("train")
	all, want := objects("imagenet/train/", 600)
	srv.Put("train", all)
	ctx := context.Background()
	src, err := Open("s3://train/imagenet/train/", Options{S3: s3Config(srv, miniotest.User, miniotest.Password)})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	entries, err := src.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	keys := slices.Sorted(maps.Keys(want))
	if len(entries) != len(keys) {
		t.Fatalf("listed %d objects, want %d", len(entries), len(keys))
	}
	for i, e := range entries {
		if e.Key != keys[i] || e.Size != int64(len(want[e.Key])) || e.Tag == 0 {
			t.Fatalf("entry %d: %+v, want key %q of %d bytes with a tag", i, e, keys[i], len(want[keys[i]]))
		}
		b, err := src.Read(ctx, e, nil)
		if err != nil {
			t.Fatalf("read %s: %v", e.Key, err)
		}
		if !bytes.Equal(b, want[e.Key]) {
			t.Fatalf("read %s: wrong bytes", e.Key)
		}
	}
	// Read into a buffer with room: the caller's memory is used.
	buf := make([]byte, 0, entries[0].Size+10)
	if b, err := src.Read(ctx, entries[0], buf); err != nil || &b[0] != &buf[:1][0] {
		t.Fatalf("read into a buffer: %v", err)
	}

	// Overwritten after listing, even with the same size: never the new
	// bytes under the old listing.
	e := entries[1]
	changed := bytes.Repeat([]byte{0xAB}, int(e.Size))
	srv.Put("train", map[string][]byte{"imagenet/train/" + e.Key: changed})
	if b, err := src.Read(ctx, e, nil); !errors.Is(err, ErrChanged) {
		t.Fatalf("read of an overwritten object: %v (equal to the new bytes: %v)", err, bytes.Equal(b, changed))
	}
	// Deleted after listing.
	srv.Remove("train", "imagenet/train/"+entries[2].Key)
	if _, err := src.Read(ctx, entries[2], nil); !errors.Is(err, ErrChanged) {
		t.Fatalf("read of a deleted object: %v", err)
	}
	// A key that was never listed cannot be read as another's.
	if _, err := src.Read(ctx, Entry{Key: "../elsewhere/outside.bin", Size: 20, Tag: 1}, nil); !errors.Is(err, ErrBadKey) {
		t.Fatalf("read outside the prefix: %v", err)
	}
	// An empty object is an item of no bytes, not a bad size.
	srv.Put("train", map[string][]byte{"imagenet/train/empty": {}})
	if b, err := src.Read(ctx, Entry{Key: "empty", Size: 0}, nil); err != nil || len(b) != 0 {
		t.Fatalf("read of an empty object: %d bytes, %v", len(b), err)
	}
}

func TestS3ErrorsSayWhatStorageSaid(t *testing.T) { forEachS3(t, testS3ErrorsSayWhatStorageSaid) }

func testS3ErrorsSayWhatStorageSaid(t *testing.T, srv s3Backend) {
	srv.Bucket("data")
	srv.Put("data", map[string][]byte{"p/x.bin": []byte("x")})
	ctx := context.Background()
	list := func(spec string, cfg S3Config) error {
		src, err := Open(spec, Options{S3: cfg})
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = src.List(ctx)
		return err
	}
	if err := list("s3://data/p", s3Config(srv, miniotest.User, "wrong-password")); srv.checksSecrets() && !errors.Is(err, ErrDenied) {
		t.Errorf("wrong secret: %v, want ErrDenied", err)
	}
	if err := list("s3://data/p", s3Config(srv, "nobody", "wrong-password")); !errors.Is(err, ErrDenied) {
		t.Errorf("unknown key id: %v, want ErrDenied", err)
	}
	if err := list("s3://missing-bucket/p", s3Config(srv, miniotest.User, miniotest.Password)); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing bucket: %v, want ErrNotFound", err)
	}
	for _, err := range []error{
		list("s3://data/p", s3Config(srv, "nobody", "wrong-password")),
		list("s3://missing-bucket/p", s3Config(srv, miniotest.User, miniotest.Password)),
	} {
		if bytes.Contains([]byte(err.Error()), []byte(miniotest.Password)) || bytes.Contains([]byte(err.Error()), []byte("wrong-password")) {
			t.Errorf("a secret in an error: %v", err)
		}
	}

	// Storage gone: reads fail (after minio-go's retries) within the
	// caller's deadline and work again once it is back.
	src, err := Open("s3://data/p", Options{S3: s3Config(srv, miniotest.User, miniotest.Password)})
	if err != nil {
		t.Fatal(err)
	}
	entries, err := src.List(ctx)
	if err != nil || len(entries) != 1 {
		t.Fatalf("list: %v %v", entries, err)
	}
	srv.Stop()
	dctx, cancel := context.WithTimeout(ctx, srv.outage())
	_, err = src.Read(dctx, entries[0], nil)
	cancel()
	if !errors.Is(err, ErrUnavailable) && !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("read with storage down: %v", err)
	}
	srv.Restart()
	if b, err := src.Read(ctx, entries[0], nil); err != nil || string(b) != "x" {
		t.Fatalf("read after storage came back: %q %v", b, err)
	}
}

func TestNormalizeS3(t *testing.T) {
	for spec, want := range map[string]string{
		"s3://bucket": "s3://bucket", "s3://bucket/": "s3://bucket", "s3://my.bucket-1/a/b/": "s3://my.bucket-1/a/b",
		"s3://Bucket/x": "", "s3://b/x": "", "s3://bucket/a/../b": "", "s3://bucket//a": "", "s3://-bucket/x": "",
		"s3://bucket/a\x01b": "", "s3://": "", "s3://abc": "s3://abc", "s3://ab": "",
		"s3://" + strings.Repeat("a", 63): "s3://" + strings.Repeat("a", 63), "s3://" + strings.Repeat("a", 64): "",
	} {
		got, err := Normalize(spec)
		if (want == "") != (err != nil) || got != want {
			t.Errorf("Normalize(%q) = %q, %v; want %q", spec, got, err, want)
		}
	}
	// An endpoint is an http or https URL with a host, nothing else.
	for _, endpoint := range []string{"ftp://minio:9000", "minio:9000", "http://", "https//x"} {
		if _, err := Open("s3://bucket", Options{S3: S3Config{Endpoint: endpoint}}); err == nil || !strings.Contains(err.Error(), "--s3-endpoint") {
			t.Errorf("endpoint %q: %v", endpoint, err)
		}
	}
	for _, endpoint := range []string{"http://minio:9000", "https://minio.example"} {
		src, err := Open("s3://bucket", Options{S3: S3Config{Endpoint: endpoint}})
		if err != nil {
			t.Errorf("endpoint %q: %v", endpoint, err)
			continue
		}
		src.Close()
	}
	if !Within("s3://bucket/a/b", "s3://bucket/a") || Within("s3://bucket/ab", "s3://bucket/a") || Within("s3://bucketx", "s3://bucket") {
		t.Error("Within on s3 specs")
	}
}

// Upload copies a directory into a bucket it makes: the prefix then lists
// the directory's keys and serves their bytes.
func TestUploadCopiesADirectory(t *testing.T) { forEachS3(t, testUploadCopiesADirectory) }

func testUploadCopiesADirectory(t *testing.T, srv s3Backend) {
	dir := t.TempDir()
	want := map[string][]byte{"a.bin": []byte("first"), "sub/b c.bin": bytes.Repeat([]byte("b"), 5000), "sub/deeper/é.bin": []byte("3")}
	for k, b := range want {
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(k)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, k), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cfg := s3Config(srv, miniotest.User, miniotest.Password)
	var n atomic.Int64
	ctx := context.Background()
	total, err := Upload(ctx, dir, "s3://fresh/copy", cfg, &n)
	if err != nil || n.Load() != 3 || total != 5006 {
		t.Fatalf("upload: %d objects, %d bytes, %v; want 3, 5006", n.Load(), total, err)
	}
	src, err := Open("s3://fresh/copy", Options{S3: cfg})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	entries, err := src.List(ctx)
	if err != nil || len(entries) != 3 {
		t.Fatalf("listed %d objects, %v; want 3", len(entries), err)
	}
	for _, e := range entries {
		b, err := src.Read(ctx, e, nil)
		if err != nil || !bytes.Equal(b, want[e.Key]) {
			t.Fatalf("%s: %q %v", e.Key, b, err)
		}
	}
	if _, err := Upload(ctx, dir, "/not/s3", cfg, nil); err == nil {
		t.Fatal("an upload to a directory was taken")
	}
}

func TestS3ObjectsWholeObjects(t *testing.T) { forEachS3(t, testS3ObjectsWholeObjects) }

// The object store of checkpoint persistence: an object written under the
// prefix reads back byte for byte with its size, lands at PREFIX/key in the
// bucket, and is gone once removed; only s3:// specs open one.
func testS3ObjectsWholeObjects(t *testing.T, srv s3Backend) {
	srv.Bucket("checkpoints")
	o, err := OpenS3Objects("s3://checkpoints/persist/", s3Config(srv, miniotest.User, miniotest.Password))
	if err != nil {
		t.Fatal(err)
	}
	defer o.Close()
	ctx := context.Background()
	want := bytes.Repeat([]byte("part"), 5000)
	if err := o.PutObject(ctx, "job/1/0", bytes.NewReader(want), int64(len(want))); err != nil {
		t.Fatal(err)
	}
	body, size, err := o.GetObject(ctx, "job/1/0")
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(body)
	body.Close()
	if err != nil || size != int64(len(want)) || !bytes.Equal(got, want) {
		t.Fatalf("read back %d bytes (size %d), %v; want the %d written", len(got), size, err, len(want))
	}
	// The object is PREFIX/key in the bucket: a dataset over the prefix lists it.
	ds, err := Open("s3://checkpoints/persist/job/", Options{S3: s3Config(srv, miniotest.User, miniotest.Password)})
	if err != nil {
		t.Fatal(err)
	}
	defer ds.Close()
	if es, err := ds.List(ctx); err != nil || len(es) != 1 || es[0].Key != "1/0" || es[0].Size != int64(len(want)) {
		t.Fatalf("listed %+v, %v", es, err)
	}
	if err := o.RemoveObject(ctx, "job/1/0"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := o.GetObject(ctx, "job/1/0"); err == nil {
		t.Fatal("a removed object read back")
	}
	if _, err := OpenS3Objects(t.TempDir(), S3Config{}); err == nil || !strings.Contains(err.Error(), "want s3://") {
		t.Fatalf("a directory as an object store: %v", err)
	}
}
