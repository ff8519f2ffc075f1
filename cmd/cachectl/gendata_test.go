package main

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"image/jpeg"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --format jpeg writes real JPEGs in class folders, and their mean size is
// about --size.
func TestGendataJPEGsDecode(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "jpegs")
	const items, mean = 60, 16 << 10
	if err := run(context.Background(), []string{"gendata", dir, "--format", "jpeg", "--items", "60", "--size", "16KiB", "--classes", "3"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "class*", "img_*.jpg"))
	if err != nil || len(files) != items {
		t.Fatalf("%d JPEG files (err %v), want %d", len(files), err, items)
	}
	classes, _ := filepath.Glob(filepath.Join(dir, "class*"))
	if len(classes) != 3 {
		t.Errorf("%d class folders, want 3", len(classes))
	}
	total := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		total += len(b)
		img, err := jpeg.Decode(bytes.NewReader(b))
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		if r := img.Bounds(); r.Dx() < 8 || r.Dy() < 8 {
			t.Errorf("%s: %v, want at least 8x8", f, r)
		}
	}
	if got := total / items; got < mean*3/4 || got > mean*5/4 {
		t.Errorf("mean size %d bytes, want %d ± 25%%", got, mean)
	}
}

// --format tar's .jpg members are real JPEGs (Pillow raised on the noise
// they used to be), beside a .cls and a .json per sample.
func TestGendataTarMembersAreJPEGs(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "wds")
	if err := run(context.Background(), []string{"gendata", dir, "--format", "tar", "--items", "25", "--shard-samples", "10", "--size", "4KiB"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	shards, _ := filepath.Glob(filepath.Join(dir, "train-*.tar"))
	if len(shards) != 3 {
		t.Fatalf("%d shards, want 3", len(shards))
	}
	count := map[string]int{}
	for _, s := range shards {
		f, err := os.Open(s)
		if err != nil {
			t.Fatal(err)
		}
		tr := tar.NewReader(f)
		for {
			h, err := tr.Next()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatalf("%s: %v", s, err)
			}
			ext := h.Name[strings.IndexByte(h.Name, '.')+1:]
			count[ext]++
			if ext != "jpg" {
				continue
			}
			if _, err := jpeg.Decode(tr); err != nil {
				t.Errorf("%s: member %s: %v", s, h.Name, err)
			}
		}
		f.Close()
	}
	if count["jpg"] != 25 || count["cls"] != 25 || count["json"] != 25 {
		t.Errorf("members by extension %v, want 25 each of jpg, cls, json", count)
	}
}

// An unknown --format is refused, writing nothing.
func TestGendataUnknownFormat(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "x")
	var ue usageError
	if err := run(context.Background(), []string{"gendata", dir, "--format", "png"}, io.Discard); !errors.As(err, &ue) {
		t.Errorf("--format png: err %v, want a usage error", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("--format png wrote %s (stat: %v)", dir, err)
	}
}
