package bench

import (
	"bufio"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// BenchmarkBatchSendBuffer streams 64-item batch responses (7 MB) over 16
// loopback connections with the server's send buffer left to autotuning (0)
// or fixed, as `cachenode --send-buffer` does. It chose the 512 KiB default:
//
//	cd bench && go test -run '^$' -bench BatchSendBuffer -benchtime 2000x .
func BenchmarkBatchSendBuffer(b *testing.B) {
	const (
		conns = 16
		size  = 64 * 110 << 10
	)
	for _, sndbuf := range []int{0, 256 << 10, 512 << 10, 2 << 20} {
		b.Run(fmt.Sprintf("sndbuf=%d", sndbuf), func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			go ServeRaw(sendBufferListener{ln, sndbuf}, size)
			requestLoad(b, ln.Addr().String(), conns, size)
		})
	}
}

// requestLoad sends b.N one-byte requests over conns connections and reads
// a size-byte answer to each, as ServeRaw and serveColdItems give them.
func requestLoad(b *testing.B, addr string, conns int, size int64) {
	var left atomic.Int64
	left.Store(int64(b.N))
	var wg sync.WaitGroup
	errs := make(chan error, conns)
	b.SetBytes(size)
	b.ResetTimer()
	for range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			br := bufio.NewReaderSize(c, 256<<10)
			for left.Add(-1) >= 0 {
				if _, err := c.Write([]byte{'x'}); err != nil {
					errs <- err
					return
				}
				if _, err := br.Discard(int(size)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// sendBufferListener fixes the send buffer of accepted connections (0 leaves
// autotuning).
type sendBufferListener struct {
	net.Listener
	size int
}

func (l sendBufferListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if tc, ok := c.(*net.TCPConn); ok && l.size > 0 {
		tc.SetWriteBuffer(l.size)
	}
	return c, err
}
