package source

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrTimeout means storage did not answer within the storage timeout.
var ErrTimeout = errors.New("storage read timed out")

// Bounded limits a source to a fixed number of reads in flight and bounds
// each read in time. A read of a hung mount (NFS, a FIFO, a stuck disk)
// blocks in the kernel and cannot be cancelled; it keeps its reader slot until
// it returns, so hung reads cost at most `readers` threads, and callers past
// that wait for a slot only until their deadline.
type Bounded struct {
	Source
	slots   chan struct{}
	timeout time.Duration
}

// NewBounded wraps s with at most readers reads in flight, each bounded by
// timeout (0: no bound but the caller's context).
func NewBounded(s Source, readers int, timeout time.Duration) *Bounded {
	return &Bounded{Source: s, slots: make(chan struct{}, max(readers, 1)), timeout: timeout}
}

type readResult struct {
	b   []byte
	err error
}

// Read is the wrapped source's Read, bounded. After ErrTimeout, buf may still
// be written by the abandoned read: the caller must not reuse it.
func (b *Bounded) Read(ctx context.Context, e Entry, buf []byte) ([]byte, error) {
	if b.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.timeout)
		defer cancel()
	}
	select {
	case b.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("read %s: waiting for a storage reader: %w", e.Key, timeoutErr(ctx))
	}
	done := make(chan readResult, 1)
	go func() {
		defer func() { <-b.slots }()
		data, err := b.Source.Read(ctx, e, buf)
		done <- readResult{data, err}
	}()
	select {
	case r := <-done:
		return r.b, r.err
	case <-ctx.Done():
		return nil, fmt.Errorf("read %s: %w", e.Key, timeoutErr(ctx))
	}
}

func timeoutErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ErrTimeout
	}
	return ctx.Err()
}
