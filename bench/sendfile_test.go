package bench

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkColdItemSend serves random items of a set far larger than the CPU
// caches (2000 × 110 KiB, as `make bench`) to 16 loopback connections, each
// sent either with write(2) from an anonymous huge-page arena (what the store
// and node do) or with sendfile(2), which hands pages to the socket without
// copying them: from a memfd arena, from a memfd per item, or from a file per
// item on the disk of the test's temporary directory (nginx's case). It is
// the evidence behind keeping write(2):
//
//	cd bench && go test -run '^$' -bench ColdItemSend -benchtime 100000x -count 3 .
//
// Client and server share the process, so MB/s is the whole loopback path.
func BenchmarkColdItemSend(b *testing.B) {
	const (
		conns = 16
		items = 2000
		size  = 110 << 10
	)
	for _, mode := range []string{"write", "memfd-arena", "memfd-per-item", "file-per-item"} {
		b.Run(mode, func(b *testing.B) {
			send, err := coldItems(b, mode, items, size)
			if err != nil {
				b.Fatal(err)
			}
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			// The node's default send buffer, so only the send path differs.
			go serveColdItems(sendBufferListener{ln, 512 << 10}, items, send)
			requestLoad(b, ln.Addr().String(), conns, int64(len(header)+size))
		})
	}
}

// itemSender sends item i on a connection.
type itemSender func(c *net.TCPConn, i int) error

// coldItems fills items distinct items of size bytes the way mode keeps them
// and returns how to send one; b's cleanup releases them.
func coldItems(b *testing.B, mode string, items, size int) (itemSender, error) {
	const page = 4096
	slot := (size + page - 1) / page * page
	item := func(i int) []byte {
		buf := make([]byte, size)
		for j := range buf {
			buf[j] = byte(i*7 + j)
		}
		return buf
	}
	switch mode {
	case "write":
		mem, err := syscall.Mmap(-1, 0, items*slot, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
		if err != nil {
			return nil, err
		}
		b.Cleanup(func() { syscall.Munmap(mem) })
		_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
		for i := range items {
			copy(mem[i*slot:], item(i))
		}
		return func(c *net.TCPConn, i int) error {
			bufs := net.Buffers{header[:], mem[i*slot : i*slot+size]}
			_, err := bufs.WriteTo(c)
			return err
		}, nil
	case "memfd-arena":
		fd, err := unix.MemfdCreate("arena", unix.MFD_CLOEXEC)
		if err != nil {
			return nil, err
		}
		b.Cleanup(func() { unix.Close(fd) })
		for i := range items {
			if _, err := unix.Pwrite(fd, item(i), int64(i*slot)); err != nil {
				return nil, err
			}
		}
		return func(c *net.TCPConn, i int) error { return sendfile(c, fd, int64(i*slot), size) }, nil
	case "memfd-per-item", "file-per-item":
		fds := make([]int, items)
		dir := b.TempDir()
		for i := range items {
			var fd int
			var err error
			if mode == "memfd-per-item" {
				fd, err = unix.MemfdCreate("item", unix.MFD_CLOEXEC)
			} else {
				fd, err = unix.Open(filepath.Join(dir, fmt.Sprint(i)), unix.O_RDWR|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
			}
			if err != nil {
				return nil, err
			}
			fds[i] = fd
			b.Cleanup(func() { unix.Close(fd) })
			if _, err := unix.Pwrite(fd, item(i), 0); err != nil {
				return nil, err
			}
		}
		return func(c *net.TCPConn, i int) error { return sendfile(c, fds[i], 0, size) }, nil
	}
	return nil, fmt.Errorf("no mode %q", mode)
}

// header stands for the ~200 bytes of HTTP response headers that go before
// every item.
var header [200]byte

// sendfile sends header and then n bytes of fd from off, waiting in the
// netpoller when the socket is full. MSG_MORE holds the header back for the
// item that follows (as TCP_CORK would), so it need not leave in a segment of
// its own. The offset is explicit: the connections share the files.
func sendfile(c *net.TCPConn, fd int, off int64, n int) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	head := header[:]
	err = rc.Write(func(s uintptr) bool {
		for len(head) > 0 {
			m, err := unix.SendmsgN(int(s), head, nil, nil, unix.MSG_MORE)
			head = head[max(m, 0):]
			if errors.Is(err, unix.EAGAIN) {
				return false
			}
			if err != nil {
				serr = err
				return true
			}
		}
		for n > 0 {
			m, err := unix.Sendfile(int(s), fd, &off, n)
			n -= max(m, 0)
			switch {
			case errors.Is(err, unix.EAGAIN):
				return false
			case err != nil:
				serr = err
				return true
			case m == 0:
				serr = io.ErrUnexpectedEOF
				return true
			}
		}
		return true
	})
	return errors.Join(err, serr)
}

// serveColdItems answers each byte read with a random item.
func serveColdItems(ln net.Listener, items int, send itemSender) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			tc, ok := c.(*net.TCPConn)
			if !ok {
				return
			}
			r := rand.New(rand.NewPCG(rand.Uint64(), 0))
			one := make([]byte, 1)
			for {
				if _, err := io.ReadFull(c, one); err != nil {
					return
				}
				if err := send(tc, r.IntN(items)); err != nil {
					return
				}
			}
		}()
	}
}
