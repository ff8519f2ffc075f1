package main

import (
	"fmt"
	"io"
	"os"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/schollz/progressbar/v3"
	"golang.org/x/term"
)

// progress shows how far a long command has got: a bar redrawn in place on
// a terminal; elsewhere (a pipe, a file, CI) plain lines, one whenever
// another 10% is done or 5 s have passed since the last line, whichever
// comes first, because carriage-return frames make a log unreadable.
type progress struct {
	w     io.Writer
	bar   *progressbar.ProgressBar // nil: plain lines
	what  string                   // "warm-up imgs"
	unit  string                   // "items"
	total int64                    // -1: unknown
	now   func() time.Time

	start, last time.Time
	lastTenth   int64
	drawn       time.Time // the bar's last frame
}

// barEvery is the shortest time between two frames of the bar.
const barEvery = 100 * time.Millisecond

// plainEvery is the longest a plain progress stays silent.
const plainEvery = 5 * time.Second

// interactive reports whether progress may be drawn as a bar: stdout and
// stderr (where it is drawn) both a terminal.
func interactive() bool {
	return term.IsTerminal(int(os.Stdout.Fd())) && term.IsTerminal(int(os.Stderr.Fd()))
}

func newProgress(w io.Writer, tty bool, what, unit string, total int64) *progress {
	p := &progress{w: w, what: what, unit: unit, total: total, now: time.Now}
	p.start, p.last = p.now(), p.now()
	if tty {
		opts := []progressbar.Option{progressbar.OptionSetDescription(what), progressbar.OptionSetWriter(w),
			progressbar.OptionThrottle(0)} // Update throttles
		if total >= 0 {
			opts = append(opts, progressbar.OptionShowCount(), progressbar.OptionShowIts(), progressbar.OptionSetItsString(unit),
				progressbar.OptionSetPredictTime(true), progressbar.OptionFullWidth())
		}
		p.bar = progressbar.NewOptions64(total, opts...)
	}
	return p
}

// Update records done units (and bytes, when known; -1 otherwise); detail
// is shown beside the count.
func (p *progress) Update(done, bytes int64, detail string) {
	if p.bar != nil {
		if detail == "" && bytes >= 0 {
			detail = humanize.IBytes(uint64(bytes))
		}
		// Throttled here, not by the bar: Describe and Set64 each draw a
		// frame, and under the bar's own throttle the second was dropped,
		// so a frame showed the new bytes beside the previous count. Here
		// both draw, and the last frame holds both.
		now := p.now()
		if now.Sub(p.drawn) < barEvery && done != p.total {
			return
		}
		p.drawn = now
		if detail != "" {
			p.bar.Describe(p.what + " (" + detail + ")")
		}
		_ = p.bar.Set64(done)
		return
	}
	now := p.now()
	tenth := int64(-1)
	if p.total > 0 {
		tenth = min(done*10/p.total, 10)
	}
	if tenth <= p.lastTenth && now.Sub(p.last) < plainEvery {
		return
	}
	p.lastTenth = max(p.lastTenth, tenth)
	p.last = now
	fmt.Fprintln(p.w, p.line(done, bytes, detail, now))
}

func (p *progress) line(done, bytes int64, detail string, now time.Time) string {
	s := fmt.Sprintf("%s: %d", p.what, done)
	if p.total >= 0 {
		s += fmt.Sprintf("/%d", p.total)
	}
	s += " " + p.unit
	if p.total > 0 {
		s += fmt.Sprintf(" (%d%%)", done*100/p.total)
	}
	if bytes >= 0 {
		s += ", " + humanize.IBytes(uint64(bytes))
	}
	if detail != "" {
		s += ", " + detail
	}
	return s + fmt.Sprintf(", %.1fs", now.Sub(p.start).Seconds())
}

// Finish ends the bar (the command prints its own last line: count, bytes
// and elapsed time).
func (p *progress) Finish() {
	if p.bar != nil {
		_ = p.bar.Finish()
		fmt.Fprintln(p.w)
	}
}

// Elapsed is the time since the progress began.
func (p *progress) Elapsed() time.Duration { return p.now().Sub(p.start) }
