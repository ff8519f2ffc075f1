package bench

import (
	"context"
	"net/http/httptest"
	"testing"

	"stallfree/source"
)

// The fake bucket speaks enough S3 for the real listing code: every key once,
// in order, across directories and pages.
func TestFakeBucketListsEveryKey(t *testing.T) {
	f := &fakeBucket{n: 2500, perDir: 1500} // two directories, the first of two pages
	srv := httptest.NewServer(f)
	defer srv.Close()
	src, err := source.Open("s3://bench/many", source.Options{S3: source.S3Config{Endpoint: srv.URL,
		Env: func(k string) string {
			return map[string]string{"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"}[k]
		}}})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	entries, err := src.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != f.n {
		t.Fatalf("%d keys listed, want %d", len(entries), f.n)
	}
	for i, e := range entries {
		if want := f.key(i)[len("many/"):]; e.Key != want || e.Size != int64(100+i%400) {
			t.Fatalf("entry %d: %s (%d bytes), want %s", i, e.Key, e.Size, want)
		}
	}
}
