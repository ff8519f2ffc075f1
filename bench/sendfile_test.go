package bench

import (
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"
)

// BenchmarkLoopbackSend compares ways to send one 110 KiB item over a
// loopback TCP connection: write(2) from memory (what the node does), and
// sendfile(2) from a regular file (nginx) or from a memfd (an arena kept in
// shared memory, as DESIGN §5 suggests). It decided against the memfd arena:
//
//	go test -run '^$' -bench LoopbackSend -benchtime 20000x ./bench
func BenchmarkLoopbackSend(b *testing.B) {
	const size = 110 << 10
	data := make([]byte, size)
	dir := b.TempDir()
	regular := filepath.Join(dir, "item")
	if err := os.WriteFile(regular, data, 0o644); err != nil {
		b.Fatal(err)
	}
	memfd, err := unix.MemfdCreate("item", unix.MFD_CLOEXEC)
	if err != nil {
		b.Skip("no memfd_create:", err) // reported as skipped, never as a pass
	}
	defer unix.Close(memfd)
	if _, err := unix.Pwrite(memfd, data, 0); err != nil {
		b.Fatal(err)
	}
	open := map[string]func() (*os.File, error){
		"file":  func() (*os.File, error) { return os.Open(regular) },
		"memfd": func() (*os.File, error) { return os.Open(fmt.Sprintf("/proc/self/fd/%d", memfd)) },
	}
	for _, mode := range []string{"write", "file", "memfd"} {
		b.Run(mode, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			done := make(chan error, 1)
			go func() {
				c, err := ln.Accept()
				if err != nil {
					done <- err
					return
				}
				defer c.Close()
				_, err = io.Copy(io.Discard, c)
				done <- err
			}()
			c, err := net.Dial("tcp", ln.Addr().String())
			if err != nil {
				b.Fatal(err)
			}
			tc := c.(*net.TCPConn)
			var f *os.File
			if mode != "write" {
				if f, err = open[mode](); err != nil {
					b.Fatal(err)
				}
				defer f.Close()
			}
			b.SetBytes(size)
			b.ResetTimer()
			for range b.N {
				if mode == "write" {
					_, err = tc.Write(data)
				} else {
					if _, err = f.Seek(0, io.SeekStart); err == nil {
						_, err = tc.ReadFrom(&io.LimitedReader{R: f, N: size})
					}
				}
				if err != nil {
					b.Fatal(err)
				}
			}
			b.StopTimer()
			c.Close()
			if err := <-done; err != nil {
				b.Fatal(err)
			}
		})
	}
}
