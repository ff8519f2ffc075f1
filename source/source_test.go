package source

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func write(t *testing.T, root, rel string, data []byte) {
	t.Helper()
	p := filepath.Join(root, rel)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, data, 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestDirManifestAndSymlinks(t *testing.T) {
	root := t.TempDir()
	outside := t.TempDir()
	write(t, outside, "secret", []byte("do not serve"))
	write(t, root, "b/2.bin", []byte("two"))
	write(t, root, "a.bin", []byte("a"))
	write(t, root, "B.bin", []byte("upper"))
	write(t, root, "empty", nil)
	must(t, os.Symlink(filepath.Join(outside, "secret"), filepath.Join(root, "escape")))
	must(t, os.Symlink("a.bin", filepath.Join(root, "alias")))
	must(t, os.Symlink(outside, filepath.Join(root, "dirlink")))

	d, err := Open("dir://"+root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	got, err := d.List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, e := range got {
		keys = append(keys, e.Key)
	}
	want := []string{"B.bin", "a.bin", "alias", "b/2.bin", "empty"}
	if !slices.Equal(keys, want) {
		t.Fatalf("keys %q, want %q", keys, want)
	}
	b, err := d.Read(context.Background(), Entry{Key: "b/2.bin", Size: 3}, nil)
	if err != nil || string(b) != "two" {
		t.Fatalf("read: %q %v", b, err)
	}
	if _, err := d.Read(context.Background(), Entry{Key: "escape", Size: 12}, nil); err == nil {
		t.Fatal("read through an escaping symlink")
	}
	if _, err := d.Read(context.Background(), Entry{Key: "../" + filepath.Base(outside) + "/secret", Size: 12}, nil); !errors.Is(err, ErrBadKey) {
		t.Fatalf("path trick: %v", err)
	}
	if _, err := d.Read(context.Background(), Entry{Key: "a.bin", Size: 5}, nil); !errors.Is(err, ErrChanged) {
		t.Fatalf("size mismatch: %v", err)
	}
	if b, err := d.Read(context.Background(), Entry{Key: "empty", Size: 0}, nil); err != nil || len(b) != 0 {
		t.Fatalf("empty: %q %v", b, err)
	}
	// A caller's buffer with room is read into; one without room is not.
	room := make([]byte, 2, 16)
	if b, err := d.Read(context.Background(), Entry{Key: "B.bin", Size: 5}, room); err != nil || string(b) != "upper" || &b[0] != &room[:1][0] {
		t.Fatalf("into a buffer with room: %q %v (same memory: %v)", b, err, len(b) > 0 && &b[0] == &room[:1][0])
	}
	small := make([]byte, 4)
	if b, err := d.Read(context.Background(), Entry{Key: "B.bin", Size: 5}, small); err != nil || string(b) != "upper" || string(small) != "\x00\x00\x00\x00" {
		t.Fatalf("into a small buffer: %q %v, buffer now %q", b, err, small)
	}
	// A file that grew or shrank since the manifest is refused, whatever the
	// buffer's room.
	for _, size := range []int64{4, 6} {
		if _, err := d.Read(context.Background(), Entry{Key: "B.bin", Size: size}, make([]byte, size)); !errors.Is(err, ErrChanged) {
			t.Errorf("5-byte file read as %d bytes: %v, want ErrChanged", size, err)
		}
		if _, err := d.Read(context.Background(), Entry{Key: "B.bin", Size: size}, make([]byte, 64)); !errors.Is(err, ErrChanged) {
			t.Errorf("5-byte file read as %d bytes into a large buffer: %v, want ErrChanged", size, err)
		}
	}
}

func TestNormalize(t *testing.T) {
	for spec, ok := range map[string]bool{
		"dir:///data": true, "/data": true, "rel/dir": true, "dir://rel": false,
		"gs://bucket": false, "": false, "/da\x00ta": false,
	} {
		got, err := Normalize(spec)
		if (err == nil) != ok {
			t.Errorf("Normalize(%q) = %q, %v", spec, got, err)
		}
		if err == nil && !strings.HasPrefix(got, "dir:///") {
			t.Errorf("Normalize(%q) = %q", spec, got)
		}
	}
}

// The limiter is asserted through its contract, not a stopwatch: a read
// that the rate cannot deliver before the caller's deadline is refused up
// front, and the same read unthrottled is not.
func TestRateLimit(t *testing.T) {
	const size = 1 << 20
	root := t.TempDir()
	write(t, root, "x", bytes.Repeat([]byte{1}, size))
	// within runs get on a source opened with opt, under a 200 ms deadline:
	// 1 MiB at 500 kB/s needs 2 s, far more than that.
	within := func(opt Options, get func(context.Context, *Dir) error) error {
		d, err := OpenDir(root, opt)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return get(ctx, d)
	}
	read := func(ctx context.Context, d *Dir) error {
		_, err := d.Read(ctx, Entry{Key: "x", Size: size}, nil)
		return err
	}
	// A shard streamed through a throttled source obeys the same rate.
	stream := func(ctx context.Context, d *Dir) error {
		r, err := d.stream(ctx, Entry{Key: "x", Size: size})
		if err != nil {
			return err
		}
		defer r.Close()
		_, err = io.Copy(io.Discard, r)
		return err
	}
	for what, get := range map[string]func(context.Context, *Dir) error{"read": read, "stream": stream} {
		if err := within(Options{BytesPerSecond: 500_000}, get); err == nil {
			t.Fatalf("a throttled %s that needs 2 s ended within a 200 ms deadline: limiter not applied", what)
		}
		if err := within(Options{}, get); err != nil {
			t.Fatalf("the same %s unthrottled: %v", what, err)
		}
	}
	// What the rate can deliver in time is delivered, an empty file too.
	write(t, root, "small", bytes.Repeat([]byte{2}, 10<<10))
	write(t, root, "empty", nil)
	d, err := OpenDir(root, Options{BytesPerSecond: 500_000})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if b, err := d.Read(ctx, Entry{Key: "small", Size: 10 << 10}, nil); err != nil || len(b) != 10<<10 || b[0] != 2 {
		t.Fatalf("10 KiB at 500 kB/s: %d bytes, %v", len(b), err)
	}
	if b, err := d.Read(ctx, Entry{Key: "empty", Size: 0}, nil); err != nil || len(b) != 0 {
		t.Fatalf("an empty file, throttled: %d bytes, %v", len(b), err)
	}
}

func TestValidKey(t *testing.T) {
	for key, ok := range map[string]bool{
		"a": true, "a/b.jpg": true, "n01440764/x.JPEG": true, "..a": true,
		"": false, "/etc/passwd": false, "a/../b": false, "..": false, "./a": false,
		"a//b": false, "a/": false, "a\x00b": false, "\xff": false, "a\nb": false, "a\rX-Evil: 1": false, "tab\there": false,
		"\x00a": false, strings.Repeat("k", 4096): true, strings.Repeat("k", 4097): false,
		"a\x1fb": false, "a\x7fb": false, "\x01a": false, "\x7f": false, "a b": true, "a~b": true, "a\u0080b": true,
	} {
		if err := ValidKey(key); (err == nil) != ok {
			t.Errorf("ValidKey(%q) = %v", key, err)
		}
	}
}

func FuzzValidKey(f *testing.F) {
	for _, s := range []string{"a/b", "../x", "/abs", "a\x00", "\xff\xfe", "a//b", "./a"} {
		f.Add(s)
	}
	root := f.TempDir()
	d, err := OpenDir(root, Options{})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, key string) {
		if ValidKey(key) != nil {
			return
		}
		// An accepted key never leaves the root once joined to it.
		full := filepath.Join(root, filepath.FromSlash(key))
		if rel, err := filepath.Rel(root, full); err != nil || rel == ".." || strings.HasPrefix(rel, "../") || filepath.IsAbs(rel) {
			t.Fatalf("key %q escapes to %q", key, full)
		}
		if _, err := d.Read(context.Background(), Entry{Key: key, Size: 1}, nil); err == nil {
			t.Fatalf("key %q read from an empty root", key)
		}
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
