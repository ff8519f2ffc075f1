package source

import (
	"context"
	"errors"
	"fmt"
	"io"
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

// Stream opens a tar shard of the wrapped source for one sequential pass.
// The stream holds a reader slot until closed, and each of its reads must
// make progress within the timeout: a whole shard may take longer than one
// read is allowed, a stalled one may not.
func (b *Bounded) Stream(ctx context.Context, shard Entry) (io.ReadCloser, error) {
	st, ok := b.Source.(Streamer)
	if !ok {
		return nil, fmt.Errorf("stream %s: the source has no shards", shard.Key)
	}
	select {
	case b.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("stream %s: waiting for a storage reader: %w", shard.Key, timeoutErr(ctx))
	}
	ctx, cancel := context.WithCancelCause(ctx)
	var watchdog *time.Timer
	if b.timeout > 0 {
		watchdog = time.AfterFunc(b.timeout, func() { cancel(ErrTimeout) })
	}
	r, err := st.Stream(ctx, shard)
	if err != nil {
		if watchdog != nil {
			watchdog.Stop()
		}
		cancel(nil)
		<-b.slots
		return nil, err
	}
	if watchdog != nil {
		watchdog.Stop() // until the first read
	}
	return &boundedStream{r: r, b: b, ctx: ctx, cancel: cancel, watchdog: watchdog}, nil
}

type boundedStream struct {
	r        io.ReadCloser
	b        *Bounded
	ctx      context.Context
	cancel   context.CancelCauseFunc
	watchdog *time.Timer
	closed   bool
}

func (s *boundedStream) Read(p []byte) (int, error) {
	if s.watchdog != nil {
		s.watchdog.Reset(s.b.timeout)
	}
	n, err := s.r.Read(p)
	if s.watchdog != nil {
		s.watchdog.Stop() // time spent between reads is the caller's
	}
	if err != nil && err != io.EOF && errors.Is(context.Cause(s.ctx), ErrTimeout) {
		err = fmt.Errorf("stream stalled: %w", ErrTimeout)
	}
	return n, err
}

func (s *boundedStream) Close() error {
	if s.closed {
		return nil
	}
	s.closed = true
	if s.watchdog != nil {
		s.watchdog.Stop()
	}
	s.cancel(nil)
	err := s.r.Close()
	<-s.b.slots
	return err
}

func timeoutErr(ctx context.Context) error {
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return ErrTimeout
	}
	return ctx.Err()
}

// Checker is a source that can tell, without reading an object, whether it
// is still the version the manifest holds (ErrChanged when not). Directories
// can (one fstatat); S3 would need a HEAD per object, so it checks on read.
type Checker interface {
	Check(ctx context.Context, e Entry) error
}

// Check asks the wrapped source whether e is unchanged, within the timeout.
// A source that cannot tell cheaply answers nil: its reads still check.
func (b *Bounded) Check(ctx context.Context, e Entry) error {
	c, ok := b.Source.(Checker)
	if !ok {
		return nil
	}
	if b.timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.timeout)
		defer cancel()
	}
	return c.Check(ctx, e)
}
