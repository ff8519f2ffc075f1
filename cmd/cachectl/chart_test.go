package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"stallfree/stall"
)

// The curves are the model's predictions at each cache size; the terminal
// chart carries both metrics with a legend per policy; --svg writes a
// picture with the same lines.
func TestWhatIfChart(t *testing.T) {
	m := stall.Model{Rates: stall.Rates{Memory: 5000, Cached: 4000, Cold: 500}, Items: 10000, Bytes: 1 << 30, GPURate: 1000}
	curves := whatIfCurves(m)
	if len(curves) != len(whatIfPolicies) {
		t.Fatalf("%d curves for %d policies", len(curves), len(whatIfPolicies))
	}
	for _, c := range curves {
		if len(c.stall) != chartSteps || c.cacheFraction[0] != 0 || c.cacheFraction[chartSteps-1] != 1 {
			t.Fatalf("%s: %d points from %v to %v", c.policy, len(c.stall), c.cacheFraction[0], c.cacheFraction[chartSteps-1])
		}
		for i, fr := range c.cacheFraction {
			if p := m.Predict(c.policy, fr); p.StallSeconds != c.stall[i] || p.EpochSeconds != c.epoch[i] {
				t.Fatalf("%s at %.2f: %v/%v, the model says %v/%v", c.policy, fr, c.stall[i], c.epoch[i], p.StallSeconds, p.EpochSeconds)
			}
			if i > 0 && c.stall[i] > c.stall[i-1] {
				t.Fatalf("%s: stall grows with the cache at %.2f", c.policy, fr)
			}
		}
		if c.stall[0] != 20-10 || c.stall[chartSteps-1] != 0 { // cold: 10000/500 s fetching against 10 s of GPU
			t.Fatalf("%s: stall from %v to %v; want 10 s to 0", c.policy, c.stall[0], c.stall[chartSteps-1])
		}
	}
	var out bytes.Buffer
	drawWhatIf(safeWriter{&out}, m, false) // as cachectl prints it off a terminal
	if bytes.Contains(out.Bytes(), []byte(`\x1b`)) || bytes.ContainsRune(out.Bytes(), 0x1b) {
		t.Errorf("the chart carries escape codes, which cachectl's stdout shows as text:\n%s", out.String())
	}
	var tty bytes.Buffer
	drawWhatIf(&tty, m, true) // on a terminal, straight to it
	if !bytes.Contains(tty.Bytes(), []byte("\x1b[94m")) || !bytes.Contains(tty.Bytes(), []byte("\x1b[91m")) {
		t.Errorf("no colours on a terminal:\n%q", tty.String())
	}
	for _, want := range []string{"stall per epoch (s) vs cache size", "epoch time (s) vs cache size", "minio", "clairvoyant", "100% of 1.0 GiB cached"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("the chart lacks %q:\n%s", want, out.String())
		}
	}
	path := filepath.Join(t.TempDir(), "w.svg")
	if err := writeWhatIfSVG(path, m, "imgs"); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil || !bytes.Contains(b, []byte("<svg")) {
		t.Fatalf("svg: %v %.100s", err, b)
	}
	for _, want := range []string{"minio stall", "minio epoch", "clairvoyant stall", "What-if for imgs"} {
		if !bytes.Contains(b, []byte(want)) {
			t.Errorf("the svg lacks %q", want)
		}
	}
	if err := writeWhatIfSVG(filepath.Join(t.TempDir(), "no", "such", "dir.svg"), m, "imgs"); err == nil {
		t.Error("an svg path in a missing directory was accepted")
	}
}
