package source

import (
	"archive/tar"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// Issue 47: a file rewritten after registration is never read as the
// registered item, whatever its new size: the listing records size and
// mtime, and a read (or a Check, which reads nothing) compares both.
func TestDirNoticesAFileChangedSinceListing(t *testing.T) {
	root := t.TempDir()
	path := filepath.Join(root, "a.bin")
	if err := os.WriteFile(path, []byte("first"), 0o644); err != nil {
		t.Fatal(err)
	}
	then := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	if err := os.Chtimes(path, then, then); err != nil {
		t.Fatal(err)
	}
	d, err := OpenDir(root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	ctx := context.Background()
	entries, err := d.List(ctx)
	if err != nil || len(entries) != 1 || entries[0].Tag == 0 {
		t.Fatalf("listing %+v, %v: want one entry with an mtime tag", entries, err)
	}
	e := entries[0]
	if b, err := d.Read(ctx, e, nil); err != nil || string(b) != "first" {
		t.Fatalf("read of the unchanged file: %q, %v", b, err)
	}
	if err := d.Check(ctx, e); err != nil {
		t.Fatalf("check of the unchanged file: %v", err)
	}
	// Same size, new bytes, new mtime: size alone would serve "other".
	if err := os.WriteFile(path, []byte("other"), 0o644); err != nil {
		t.Fatal(err)
	}
	later := then.Add(time.Second)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	if b, err := d.Read(ctx, e, nil); !errors.Is(err, ErrChanged) {
		t.Fatalf("read of a file rewritten at the same size: %q, %v; want ErrChanged", b, err)
	}
	if err := d.Check(ctx, e); !errors.Is(err, ErrChanged) {
		t.Fatalf("check of a file rewritten at the same size: %v; want ErrChanged", err)
	}
	// Another size, the old mtime put back: the size says so.
	if err := os.WriteFile(path, []byte("much longer now"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, then, then); err != nil {
		t.Fatal(err)
	}
	if err := d.Check(ctx, e); !errors.Is(err, ErrChanged) {
		t.Fatalf("check of a file of another size: %v; want ErrChanged", err)
	}
	// A manifest entry without a tag (registered before tags) is checked
	// by size alone, as it was.
	untagged := Entry{Key: e.Key, Size: int64(len("much longer now"))}
	if err := d.Check(ctx, untagged); err != nil {
		t.Fatalf("check of an untagged entry of the right size: %v", err)
	}
	// The Bounded wrapper passes the check on; it is what the node holds.
	if err := NewBounded(d, 1, time.Second).Check(ctx, e); !errors.Is(err, ErrChanged) {
		t.Fatalf("Bounded.Check: %v; want ErrChanged", err)
	}
}

// A tar shard rewritten at the same size (members moved or replaced in
// place) is caught by its mtime.
func TestTarNoticesAShardRewrittenAtTheSameSize(t *testing.T) {
	root := t.TempDir()
	path := filepath.Join(root, "x.tar")
	writeTar(t, path, []member{{name: "a.jpg", data: []byte("first"), typ: tar.TypeReg}})
	then := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(path, then, then); err != nil {
		t.Fatal(err)
	}
	src := openTarDir(t, root)
	entries, err := src.List(context.Background())
	if err != nil || len(entries) != 1 {
		t.Fatalf("%v %v", entries, err)
	}
	writeTar(t, path, []member{{name: "a.jpg", data: []byte("other"), typ: tar.TypeReg}})
	later := then.Add(time.Second)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	if b, err := src.Read(context.Background(), entries[0], nil); !errors.Is(err, ErrChanged) {
		t.Fatalf("read %q, err %v: want ErrChanged", b, err)
	}
}

// A file that is no longer there as a file inside the dataset is a changed
// source, not a failing read: deleted, its directory replaced by a file, a
// symlink leading out of the dataset or looping in its place. Each read and
// check says ErrChanged (409, and a warm-up drops the held copy); the
// attack round had 500 for each and a warm-up that kept serving them.
func TestDirFilesGoneSinceListingAreChanged(t *testing.T) {
	root := t.TempDir()
	for _, name := range []string{"deleted.bin", "escaped.bin", "looped.bin", "sub/inner.bin"} {
		path := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("bytes"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	outside := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(outside, []byte("bytes"), 0o644); err != nil {
		t.Fatal(err)
	}
	d, entries := listedDir(t, root, 4)
	ctx := context.Background()
	for _, change := range []func() error{
		func() error { return os.Remove(filepath.Join(root, "deleted.bin")) },
		func() error {
			os.Remove(filepath.Join(root, "escaped.bin"))
			return os.Symlink(outside, filepath.Join(root, "escaped.bin"))
		},
		func() error {
			os.Remove(filepath.Join(root, "looped.bin"))
			return os.Symlink("looped.bin", filepath.Join(root, "looped.bin"))
		},
		func() error {
			os.RemoveAll(filepath.Join(root, "sub"))
			return os.WriteFile(filepath.Join(root, "sub"), []byte("a file now"), 0o644)
		},
	} {
		if err := change(); err != nil {
			t.Fatal(err)
		}
	}
	for _, e := range entries {
		if b, err := d.Read(ctx, e, nil); !errors.Is(err, ErrChanged) {
			t.Errorf("read of %s: %q, %v; want ErrChanged", e.Key, b, err)
		}
		if err := d.Check(ctx, e); !errors.Is(err, ErrChanged) {
			t.Errorf("check of %s: %v; want ErrChanged", e.Key, err)
		}
	}
}

// A file or shard written while it is read (its mtime set back, even) is
// not handed on: its size and mtime were checked before the read, so a
// rewrite in place during it was served torn, half of each version, and
// kept. Each read is checked against the fstat taken before it (ctime,
// which no user can set, moves on every write). A chmod during a read (the
// ctime moves too) is read again and served; a pass over a shard, which
// cannot be read again, goes on over one.
func TestAFileWrittenWhileItIsReadIsChanged(t *testing.T) {
	root := t.TempDir()
	path := filepath.Join(root, "a.bin")
	then := time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)
	write := func(b []byte) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_WRONLY, 0) // in place: the open file is this one
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(b); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	rewrite := func(b []byte) {
		t.Helper()
		write(b)
		if err := os.Chtimes(path, then, then); err != nil { // the mtime put back
			t.Fatal(err)
		}
	}
	chmods := 0
	chmod := func(string) {
		if chmods++; chmods == 1 {
			if err := os.Chmod(path, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.WriteFile(path, []byte("first"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Chtimes(path, then, then); err != nil {
		t.Fatal(err)
	}
	d, entries := listedDir(t, root, 1)
	ctx := context.Background()
	e := entries[0]
	d.afterRead = func(string) { rewrite([]byte("other")) }
	if b, err := d.Read(ctx, e, nil); !errors.Is(err, ErrChanged) {
		t.Fatalf("a file written while it was read: %q, %v; want ErrChanged", b, err)
	}
	buf := make([]byte, 2)
	if err := d.readAt(ctx, Entry{Key: e.Key, Size: e.Size, Tag: e.Tag}, 1, buf); !errors.Is(err, ErrChanged) {
		t.Fatalf("a shard written while a member was read: %q, %v; want ErrChanged", buf, err)
	}
	d.afterRead = chmod
	if b, err := d.Read(ctx, e, nil); err != nil || string(b) != "other" || chmods != 2 {
		t.Fatalf("a file chmod-ed while it was read: %q, %v after %d reads; want its bytes after 2", b, err, chmods)
	}
	d.afterRead = nil

	// A pass over a shard: a chmod does not stop it; the read after a write
	// fails, with nothing of it handed on.
	r, err := d.stream(ctx, Entry{Key: e.Key, Size: e.Size, Tag: e.Tag})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	one := make([]byte, 1)
	if n, err := r.Read(one); n != 1 || err != nil {
		t.Fatalf("the first byte: %d, %v", n, err)
	}
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if n, err := r.Read(one); n != 1 || err != nil {
		t.Fatalf("a read after a chmod: %d, %v", n, err)
	}
	write([]byte("xxxxx")) // a new mtime
	if n, err := r.Read(one); n != 0 || !errors.Is(err, ErrChanged) {
		t.Fatalf("a read after the shard was rewritten: %d bytes (%q), %v; want none and ErrChanged", n, one[:n], err)
	}
}

// listedDir opens root (closed when the test ends) and lists it: n entries.
func listedDir(t *testing.T, root string, n int) (*Dir, []Entry) {
	t.Helper()
	d, err := OpenDir(root, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	entries, err := d.List(context.Background())
	if err != nil || len(entries) != n {
		t.Fatalf("listing %+v, %v; want %d entries", entries, err, n)
	}
	return d, entries
}
