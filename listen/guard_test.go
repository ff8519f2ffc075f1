package listen

import (
	"bytes"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// fdStarved is a listener that fails with errs, one per Accept, before it
// hands out a pipe.
type fdStarved struct {
	net.Listener
	errs []error
}

func (l *fdStarved) Accept() (net.Conn, error) {
	if len(l.errs) > 0 {
		err := l.errs[0]
		l.errs = l.errs[1:]
		return nil, err
	}
	c, _ := net.Pipe()
	return c, nil
}

// logged collects what a guard logs, for counting its lines.
type logged struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logged) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logged) count(msg string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Count(l.buf.String(), msg)
}

// Out of file descriptors, Accept waits and tries again instead of failing,
// logging one warning for the episode and one line when it recovers; any
// other error is returned.
func TestAcceptOutlastsFdExhaustion(t *testing.T) {
	var out logged
	errs := []error{syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM}
	ln := Guard(&fdStarved{errs: errs}, Options{Name: "test", Log: slog.New(slog.NewTextHandler(&out, nil))})
	c, err := ln.Accept()
	if err != nil {
		t.Fatalf("accept after fd exhaustion: %v", err)
	}
	c.Close()
	if w, i := out.count("out of file descriptors"), out.count("accepting again\""); w != 1 || i != 1 {
		t.Fatalf("one episode logged %d warnings and %d recoveries, want 1 and 1:\n%s", w, i, out.buf.String())
	}
	if c, err = ln.Accept(); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if i := out.count("accepting again\""); i != 1 {
		t.Fatalf("an accept with no episode logged a recovery (%d in all)", i)
	}
	other := errors.New("listener closed")
	if _, err := Guard(&fdStarved{errs: []error{other}}, Options{}).Accept(); !errors.Is(err, other) {
		t.Fatalf("another error: %v, want it returned", err)
	}
}

// MaxConns 0 bounds nothing; refusals are logged once per ten seconds, not
// once per connection.
func TestUnboundedAndRefusalLogging(t *testing.T) {
	ln := Guard(&fdStarved{}, Options{Name: "test"})
	for range 3 {
		c, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
	}
	if Active(ln) != 3 {
		t.Fatalf("active %d with no bound, want 3", Active(ln))
	}
	if n := Active(&fdStarved{}); n != -1 {
		t.Fatalf("Active of a listener it does not guard: %d, want -1", n)
	}

	var out logged
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	capped := Guard(raw, Options{Name: "test", MaxConns: 1, Log: slog.New(slog.NewTextHandler(&out, nil))})
	defer capped.Close()
	held, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		if c, err := capped.Accept(); err == nil {
			defer c.Close()
			capped.Accept() // refuses the rest until the listener closes
		}
	}()
	for range 3 {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(c); err != nil {
			t.Fatalf("a refused connection was not closed: %v", err)
		}
		c.Close()
	}
	capped.Close()
	<-done
	if n := out.count("too many connections"); n != 1 {
		t.Fatalf("3 refusals logged %d times, want once", n)
	}
}
