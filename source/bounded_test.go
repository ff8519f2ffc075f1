package source

import (
	"context"
	"errors"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// hung is a source whose reads block until released, like a hung mount.
type hung struct {
	release chan struct{}
	running atomic.Int32
	peak    atomic.Int32
}

func (h *hung) List(context.Context) ([]Entry, error) { return nil, nil }
func (h *hung) Close() error                          { return nil }
func (h *hung) Read(_ context.Context, e Entry, buf []byte) ([]byte, error) {
	n := h.running.Add(1)
	for p := h.peak.Load(); n > p && !h.peak.CompareAndSwap(p, n); p = h.peak.Load() {
	}
	<-h.release // the kernel does not let go: the context is not looked at
	h.running.Add(-1)
	return buf[:e.Size], nil
}

// guarded is a caller's context that gives up (cancelled, not timed out)
// long after any bound under test: a Bounded that forgets its own bound
// fails the test with context.Canceled instead of hanging it.
func guarded(t *testing.T) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	stop := time.AfterFunc(5*time.Second, cancel)
	t.Cleanup(func() { stop.Stop(); cancel() })
	return ctx
}

// Reads of a hung source end with ErrTimeout at the deadline, and no more
// than `readers` of them are ever stuck in the source at once.
func TestBoundedReadsTimeOutAndStayFew(t *testing.T) {
	h := &hung{release: make(chan struct{})}
	b := NewBounded(h, 3, 100*time.Millisecond)
	ctx := guarded(t)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	start := time.Now()
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := b.Read(ctx, Entry{Key: "k", Size: 4}, make([]byte, 4))
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if !errors.Is(err, ErrTimeout) {
			t.Fatalf("err %v, want ErrTimeout", err)
		}
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("20 reads took %v to time out", took)
	}
	if p := h.peak.Load(); p != 3 {
		t.Fatalf("%d reads were stuck in the source at once, want the 3 readers", p)
	}
	close(h.release)
	// Released, the readers come back for later reads.
	for h.running.Load() > 0 {
		time.Sleep(time.Millisecond)
	}
	h2 := &hung{release: make(chan struct{})}
	close(h2.release)
	if _, err := NewBounded(h2, 1, time.Second).Read(context.Background(), Entry{Key: "k", Size: 2}, make([]byte, 2)); err != nil {
		t.Fatal(err)
	}
}

// trickle is a shard source whose streams return one byte per read after
// delay, and block until their context ends once stall bytes were read.
type trickle struct {
	hung
	delay time.Duration
	stall int
}

func (tr *trickle) Stream(ctx context.Context, shard Entry) (io.ReadCloser, error) {
	return &trickleStream{ctx: ctx, tr: tr, left: int(shard.Size)}, nil
}

type trickleStream struct {
	ctx  context.Context
	tr   *trickle
	read int
	left int
}

func (s *trickleStream) Read(p []byte) (int, error) {
	if s.left == 0 {
		return 0, io.EOF
	}
	if s.read == s.tr.stall {
		<-s.ctx.Done() // like a GET whose body stops coming: only the context ends it
		return 0, s.ctx.Err()
	}
	time.Sleep(s.tr.delay)
	if err := s.ctx.Err(); err != nil { // like a body read after its request was cancelled
		return 0, err
	}
	p[0] = 'x'
	s.read, s.left = s.read+1, s.left-1
	return 1, nil
}

func (s *trickleStream) Close() error { return nil }

// A stream is bounded per read, not as a whole: a shard that keeps coming
// may take many timeouts in all; one that stops fails with ErrTimeout. It
// holds its reader slot until closed.
func TestBoundedStreamTimesOutOnlyWhenStalled(t *testing.T) {
	const timeout = 200 * time.Millisecond
	tr := &trickle{hung: hung{release: make(chan struct{})}, delay: timeout / 4, stall: -1}
	close(tr.release)
	b := NewBounded(tr, 1, timeout)
	ctx := guarded(t)
	r, err := b.Stream(ctx, Entry{Key: "a.tar", Size: 12})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Read(ctx, Entry{Key: "k", Size: 1}, make([]byte, 1)); !errors.Is(err, ErrTimeout) {
		t.Fatalf("a read while the only reader streams: %v, want ErrTimeout", err)
	}
	got, err := io.ReadAll(r) // 12 reads of timeout/4 each: 3 timeouts in all
	if err != nil || string(got) != "xxxxxxxxxxxx" {
		t.Fatalf("a slow but steady stream: %q, %v", got, err)
	}
	r.Close()
	if _, err := b.Read(context.Background(), Entry{Key: "k", Size: 1}, make([]byte, 1)); err != nil {
		t.Fatalf("the reader was not given back on Close: %v", err)
	}

	tr.stall = 3
	r, err = b.Stream(ctx, Entry{Key: "b.tar", Size: 12})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got, err := io.ReadAll(r); !errors.Is(err, ErrTimeout) || len(got) != 3 {
		t.Fatalf("a stalled stream: %d bytes, %v; want 3 and ErrTimeout", len(got), err)
	}
}

func TestBoundedStreamNeedsShards(t *testing.T) {
	h := &hung{release: make(chan struct{})}
	if _, err := NewBounded(h, 1, time.Second).Stream(context.Background(), Entry{Key: "a.tar"}); err == nil {
		t.Fatal("a source without shards was streamed")
	}
}

// A timeout of 0 bounds nothing but the caller's context: reads and
// streams go through.
func TestBoundedWithoutATimeout(t *testing.T) {
	tr := &trickle{hung: hung{release: make(chan struct{})}, delay: 10 * time.Millisecond, stall: -1}
	close(tr.release)
	b := NewBounded(tr, 1, 0)
	if got, err := b.Read(context.Background(), Entry{Key: "k", Size: 1}, make([]byte, 1)); err != nil || len(got) != 1 {
		t.Fatalf("read: %d bytes, %v", len(got), err)
	}
	r, err := b.Stream(context.Background(), Entry{Key: "a.tar", Size: 12})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if got, err := io.ReadAll(r); err != nil || len(got) != 12 {
		t.Fatalf("stream: %d bytes, %v", len(got), err)
	}
}
