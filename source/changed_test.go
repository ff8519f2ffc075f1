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
