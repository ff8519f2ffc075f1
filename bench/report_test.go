package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// BENCHMARKS.md must be exactly what its recorded run and the notes in this
// package make of it: figures are never edited by hand, and notes edited
// here reach the document (`bin/sfbench -report` rewrites it).
func TestBenchmarksDocMatchesItsRun(t *testing.T) {
	root := ".."
	rep, err := ReadReport(filepath.Join(root, "docs", "bench", "results.json"))
	if err != nil {
		t.Fatal(err)
	}
	doc, err := os.ReadFile(filepath.Join(root, "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	got := Markdown(rep, "docs/bench")
	// Below KeptMarker: sections other benchmarks write (python -m
	// stallfree.bench --checkpoint --doc BENCHMARKS.md), kept by a rewrite.
	if i := strings.Index(string(doc), KeptMarker); i >= 0 {
		doc, got = doc[:i], strings.TrimRight(got, "\n")+"\n\n"
	}
	if got != string(doc) {
		t.Errorf("BENCHMARKS.md differs from what docs/bench/results.json and bench/report.go give (%d vs %d bytes): run bin/sfbench -report", len(doc), len(got))
	}
}
