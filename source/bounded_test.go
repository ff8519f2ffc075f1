package source

import (
	"context"
	"errors"
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

// Reads of a hung source end with ErrTimeout at the deadline, and no more
// than `readers` of them are ever stuck in the source at once.
func TestBoundedReadsTimeOutAndStayFew(t *testing.T) {
	h := &hung{release: make(chan struct{})}
	b := NewBounded(h, 3, 100*time.Millisecond)
	var wg sync.WaitGroup
	errs := make(chan error, 20)
	start := time.Now()
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := b.Read(context.Background(), Entry{Key: "k", Size: 4}, make([]byte, 4))
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
