package main

import (
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"
)

// Off a terminal: plain lines, one per 10% or per 5 s of silence, never a
// carriage return.
func TestPlainProgressLines(t *testing.T) {
	var out bytes.Buffer
	clock := time.Unix(1000, 0)
	p := newProgress(&out, false, "warm-up imgs", "items", 1000)
	p.now = func() time.Time { return clock }
	p.start, p.last = clock, clock
	for done := int64(0); done <= 1000; done += 5 {
		clock = clock.Add(10 * time.Millisecond)
		p.Update(done, done*100, "")
	}
	p.Finish()
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 10 {
		t.Fatalf("%d lines for 0..100%% in 2 s, want 10 (one per 10%%):\n%s", len(lines), out.String())
	}
	if want := "warm-up imgs: 100/1000 items (10%), 9.8 KiB, 0.2s"; lines[0] != want {
		t.Errorf("first line %q, want %q", lines[0], want)
	}
	if !strings.HasPrefix(lines[9], "warm-up imgs: 1000/1000 items (100%)") {
		t.Errorf("last line %q", lines[9])
	}
	if strings.ContainsAny(out.String(), "\r\x1b") {
		t.Errorf("terminal control characters in plain output: %q", out.String())
	}

	// Slow progress: a line every 5 s even within one tenth.
	out.Reset()
	p = newProgress(&out, false, "listing s3", "objects", -1)
	p.now = func() time.Time { return clock }
	p.start, p.last = clock, clock
	for i := range 24 {
		clock = clock.Add(time.Second)
		p.Update(int64(i), -1, "")
	}
	if n := strings.Count(out.String(), "\n"); n != 4 {
		t.Fatalf("%d lines in 24 s, want 4 (one per 5 s):\n%s", n, out.String())
	}
	if !strings.HasPrefix(out.String(), "listing s3: 4 objects, 5.0s\n") {
		t.Errorf("got %q", out.String())
	}
}

// On a terminal each frame shows the count and the bytes of one update:
// the bytes were drawn at once and the count with the next frame.
func TestBarFramesAgree(t *testing.T) {
	var out bytes.Buffer
	p := newProgress(&out, true, "warm-up imgs", "items", 2000)
	clock := time.Unix(1000, 0)
	p.now = func() time.Time { return clock }
	for _, done := range []int64{25, 50, 75} {
		clock = clock.Add(barEvery)
		out.Reset()
		p.Update(done, done<<20, "")
		frames := strings.Split(out.String(), "\r")
		last := frames[len(frames)-1]
		if want := fmt.Sprintf("(%d MiB)", done); !strings.Contains(last, want) || !strings.Contains(last, fmt.Sprintf("(%d/2000", done)) {
			t.Fatalf("frame after update %d: %q; want %s and the count %d", done, last, want, done)
		}
	}
	out.Reset()
	clock = clock.Add(barEvery / 2)
	p.Update(80, 80<<20, "")
	if out.Len() != 0 {
		t.Fatalf("a frame %v after the last: %q", barEvery/2, out.String())
	}
	p.Update(2000, 2000<<20, "")
	if !strings.Contains(out.String(), "(2000/2000") {
		t.Fatalf("the last update was not drawn at once: %q", out.String())
	}
}
