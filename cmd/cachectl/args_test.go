package main

import (
	"context"
	"errors"
	"flag"
	"io"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

func TestParseCommandTakesFlagsAnywhere(t *testing.T) {
	for _, args := range [][]string{
		{"DIR", "--items", "7"},
		{"--items", "7", "DIR"},
		{"--items=7", "--", "DIR"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		items := fs.Int("items", 1, "")
		pos, err := parseCommand(fs, args, 1, "t DIR")
		if err != nil || !slices.Equal(pos, []string{"DIR"}) || *items != 7 {
			t.Errorf("%q: positionals %q, items %d, err %v; want [DIR], 7, nil", args, pos, *items, err)
		}
	}
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Int("items", 1, "")
	if pos, err := parseCommand(fs, []string{"--items", "7", "--", "--odd-name"}, 1, "t DIR"); err != nil || !slices.Equal(pos, []string{"--odd-name"}) {
		t.Errorf(`after "--": positionals %q, err %v; want [--odd-name]`, pos, err)
	}
	var ue usageError
	for _, args := range [][]string{{}, {"A", "B"}, {"--items", "7"}} {
		if _, err := parseCommand(fs, args, 1, "t DIR"); !errors.As(err, &ue) {
			t.Errorf("%q: err %v, want a usage error", args, err)
		}
	}
	if _, err := parseCommand(fs, []string{"DIR", "--no-such"}, 1, "t DIR"); err == nil {
		t.Error("an unknown flag after the positional was accepted")
	}
}

// gendata writes where it is told, with the flags given in any order, and
// writes nothing when asked for help or given the wrong arguments.
func TestGendataArguments(t *testing.T) {
	t.Chdir(t.TempDir())
	ctx := context.Background()
	if err := run(ctx, []string{"gendata", "--items", "3", "--size", "1KiB", "out"}, io.Discard); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob("out/class*/img_*.bin")
	if len(files) != 3 {
		t.Fatalf("wrote %d files into out, want 3: %q", len(files), files)
	}
	if err := os.RemoveAll("out"); err != nil {
		t.Fatal(err)
	}
	if err := run(ctx, []string{"gendata", "--help"}, io.Discard); !errors.Is(err, flag.ErrHelp) {
		t.Errorf("gendata --help: err %v, want flag.ErrHelp", err)
	}
	var ue usageError
	if err := run(ctx, []string{"gendata", "a", "b", "--items", "1"}, io.Discard); !errors.As(err, &ue) {
		t.Errorf("gendata a b: err %v, want a usage error", err)
	}
	if left, _ := os.ReadDir("."); len(left) != 0 {
		t.Errorf("refused commands wrote %d entries, e.g. %q", len(left), left[0].Name())
	}
}
