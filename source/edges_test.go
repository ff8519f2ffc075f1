package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"stallfree/miniotest"
)

// Only a positive rate throttles a directory: with none, reads never wait on
// a limiter. (First in this file, and so before any directory is read: a
// limiter of rate 0 would hang every read after it rather than fail.)
func TestDirThrottledOnlyByAPositiveRate(t *testing.T) {
	for _, bps := range []int64{0, -1, 1 << 20} {
		d, err := OpenDir(t.TempDir(), Options{BytesPerSecond: bps})
		if err != nil {
			t.Fatal(err)
		}
		if got := d.limiter != nil; got != (bps > 0) {
			t.Errorf("BytesPerSecond %d: limiter %v, want %v", bps, got, bps > 0)
		}
		d.Close()
	}
}

// A read into a buffer of exactly the item's size uses the caller's memory;
// a file that grew since it was listed is refused, never cut to size.
func TestDirReadBufferAndGrownFile(t *testing.T) {
	dir := t.TempDir()
	want := bytes.Repeat([]byte{7}, 100)
	if err := os.WriteFile(filepath.Join(dir, "a.bin"), want, 0o644); err != nil {
		t.Fatal(err)
	}
	src, err := Open(dir, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	ctx := context.Background()
	entries, err := src.List(ctx)
	if err != nil || len(entries) != 1 {
		t.Fatalf("list: %v %v", entries, err)
	}
	buf := make([]byte, 0, 100)
	b, err := src.Read(ctx, entries[0], buf)
	if err != nil || !bytes.Equal(b, want) || &b[0] != &buf[:1][0] {
		t.Fatalf("read into a buffer of exactly 100 bytes: %v (own memory: %v)", err, err == nil && &b[0] == &buf[:1][0])
	}
	if err := os.WriteFile(filepath.Join(dir, "a.bin"), append(want, 7), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Read(ctx, entries[0], nil); !errors.Is(err, ErrChanged) {
		t.Fatalf("read of a file one byte longer than listed: %v, want ErrChanged", err)
	}
}

// The region a node is given signs its requests; without one, us-east-1.
// An empty object is listed (an item of no bytes); an object of exactly the
// size bound is listed and one a byte over it is left out.
func TestS3RegionAndListingBounds(t *testing.T) {
	srv := startFakeS3(t, miniotest.User)
	srv.Bucket("bkt")
	srv.Put("bkt", map[string][]byte{"p/empty": {}, "p/five": []byte("12345"), "p/six": []byte("123456")})
	ctx := context.Background()
	for _, region := range []string{"", "eu-west-1"} {
		cfg := s3Config(srv, miniotest.User, miniotest.Password)
		cfg.Region = region
		src, err := Open("s3://bkt/p", Options{S3: cfg})
		if err != nil {
			t.Fatal(err)
		}
		entries, err := src.(*S3).list(ctx, 5)
		leftOut := src.(*S3).LeftOut()
		src.Close()
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, e := range entries {
			keys = append(keys, e.Key)
		}
		if len(keys) != 2 || keys[0] != "empty" || keys[1] != "five" || leftOut != 1 {
			t.Fatalf("listed %v under a 5-byte bound, %d left out; want [empty five] and six left out", keys, leftOut)
		}
		want := region
		if want == "" {
			want = "us-east-1"
		}
		if got, _ := srv.region.Load().(string); got != want {
			t.Fatalf("region %q signed as %q, want %q", region, got, want)
		}
	}
}

// A server that lists the same page without end (its continuation token
// repeated) fails the listing at the first repeated key, instead of growing
// it for as long as the request lasts.
func TestS3ListingThatRepeatsItselfFails(t *testing.T) {
	srv := startFakeS3(t, miniotest.User)
	srv.Bucket("bkt")
	objs := map[string][]byte{}
	for i := range 25 { // three pages of 10
		objs[fmt.Sprintf("p/d%d/k%02d", i%2, i)] = []byte("x")
		objs[fmt.Sprintf("p/k%02d", i)] = []byte("x")
	}
	srv.Put("bkt", objs)
	src, err := Open("s3://bkt/p", Options{S3: s3Config(srv, miniotest.User, miniotest.Password)})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	entries, err := src.List(context.Background())
	if err != nil || len(entries) != 50 {
		t.Fatalf("the listing as it should be: %d entries, %v", len(entries), err)
	}
	srv.repeatPage.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if entries, err := src.List(ctx); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "repeats itself") {
		t.Fatalf("a listing repeating its first page: %d entries, %v; want ErrUnavailable", len(entries), err)
	}
}

// S3's answers, by what they mean to a caller: denied (whatever the code,
// a 403), a bucket that is not there, an object gone since it was listed,
// anything else storage being unavailable.
func TestS3ErrorKinds(t *testing.T) {
	for _, tc := range []struct {
		resp minio.ErrorResponse
		want error
	}{
		{minio.ErrorResponse{Code: "AccessDenied", StatusCode: 403}, ErrDenied},
		{minio.ErrorResponse{Code: "InvalidAccessKeyId", StatusCode: 400}, ErrDenied},
		{minio.ErrorResponse{Code: "SignatureDoesNotMatch", StatusCode: 400}, ErrDenied},
		{minio.ErrorResponse{Code: "AllAccessDisabled", StatusCode: 403}, ErrDenied},
		{minio.ErrorResponse{Code: "NoSuchBucket", StatusCode: 404}, ErrNotFound},
		{minio.ErrorResponse{Code: "NoSuchKey", StatusCode: 404}, ErrChanged},
		{minio.ErrorResponse{Code: "SlowDown", StatusCode: 503}, ErrUnavailable},
		{minio.ErrorResponse{}, ErrUnavailable},
	} {
		if got := errorKind(tc.resp); got != tc.want {
			t.Errorf("%s (%d): %v, want %v", tc.resp.Code, tc.resp.StatusCode, got, tc.want)
		}
	}
}

// Resolve names where a source really is: a directory's symlinks followed
// (a tar source's too, keeping no scheme of its own), an S3 source as it is
// normalized; a spec that is not one, or a path that is not there, fails.
func TestResolve(t *testing.T) {
	root := t.TempDir()
	real := filepath.Join(root, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	link := filepath.Join(root, "link")
	if err := os.Symlink(real, link); err != nil {
		t.Fatal(err)
	}
	for spec, want := range map[string]string{
		link: "dir://" + real, "dir://" + link: "dir://" + real, "tar+dir://" + link: "dir://" + real,
		real: "dir://" + real, "s3://bucket/pre/": "s3://bucket/pre", "tar+s3://bucket": "s3://bucket",
	} {
		if got, err := Resolve(spec); err != nil || got != want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", spec, got, err, want)
		}
	}
	for _, bad := range []string{"ftp://x", filepath.Join(root, "gone"), "s3://B"} {
		if got, err := Resolve(bad); err == nil {
			t.Errorf("Resolve(%q) = %q", bad, got)
		}
	}
}
