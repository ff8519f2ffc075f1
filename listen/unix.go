package listen

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"syscall"
	"time"
)

// maxSocketPath is the longest path a Unix socket can be bound to on Linux
// (sun_path is 108 bytes, one of them the terminating NUL).
const maxSocketPath = 107

// Unix listens on a Unix stream socket at path, for clients on this host
// (the loader fast path: a same-host client skips the loopback TCP stack).
// The socket file gets mode (0600 keeps other users out); on Linux the mode
// is set on the socket before bind, so it is never reachable with a looser
// one. A socket file left behind by a process that died is replaced; one a
// live process still answers on is not, nor is any other kind of file. The
// listener removes the file when it is closed.
func Unix(path string, mode fs.FileMode) (net.Listener, error) {
	if len(path) > maxSocketPath {
		return nil, fmt.Errorf("socket path %s is %d bytes; Unix sockets allow at most %d", path, len(path), maxSocketPath)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
		var err error
		// bind(2) creates the file with the socket inode's mode (less the
		// umask): set it now, or there is a window in which a looser mode
		// lets another user connect.
		if cerr := c.Control(func(fd uintptr) { err = syscall.Fchmod(int(fd), uint32(mode.Perm())) }); cerr != nil {
			return cerr
		}
		return err
	}}
	ln, err := lc.Listen(context.Background(), "unix", path)
	if err != nil {
		return nil, err
	}
	// The umask may have taken bits the caller wants (0666 for a node
	// without a token, which anyone on the host may use over TCP too).
	if err := os.Chmod(path, mode.Perm()); err != nil {
		ln.Close()
		return nil, fmt.Errorf("socket %s: %w", path, err)
	}
	return ln, nil
}

// removeStale clears path for a new socket: nothing there, or a socket
// nobody accepts on (its process died without removing it).
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	if fi.Mode().Type() != fs.ModeSocket {
		return fmt.Errorf("%s exists and is not a socket; not replacing it", path)
	}
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		c.Close()
		return fmt.Errorf("socket %s is in use by another process (another node on the same data directory?)", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("socket %s exists and cannot be checked: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	return nil
}
