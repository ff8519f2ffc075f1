// Package datadir guards a node's data directory: one process at a time.
package datadir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// LockFile is the file in the data directory that the node holding the
// directory keeps locked; it holds that node's pid.
const LockFile = "LOCK"

// ErrInUse means another live process holds the directory.
var ErrInUse = errors.New("data directory in use")

// Lock is an exclusive hold on a data directory, kept until Close or until
// the process ends.
type Lock struct{ f *os.File }

// Acquire creates dir when missing and takes an exclusive flock on its LOCK
// file without waiting. A second node on the same directory would write the
// same raft log and corrupt it, so it gets an error naming the directory and
// the holder's pid instead. The kernel drops a flock when its holder dies,
// however it dies, so a lock left by a dead process never blocks a restart:
// the pid in the file is informative only, never trusted.
func Acquire(dir string) (*Lock, error) {
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", dir, err)
	}
	path := filepath.Join(dir, LockFile)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("--data-dir %s: %w", dir, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := "another process"
			if b, rerr := os.ReadFile(path); rerr == nil {
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
					holder = fmt.Sprintf("pid %d", pid)
				}
			}
			abs, _ := filepath.Abs(dir)
			return nil, fmt.Errorf("%w: --data-dir %s is held by %s (another cachenode?); stop it or give this node a directory of its own",
				ErrInUse, abs, holder)
		}
		return nil, fmt.Errorf("--data-dir %s: locking %s: %w", dir, path, err)
	}
	// Ours now: record who holds it, for the next one to name.
	if err := f.Truncate(0); err == nil {
		_, err = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("--data-dir %s: writing %s: %w", dir, path, err)
		}
	}
	return &Lock{f: f}, nil
}

// Close releases the directory.
func (l *Lock) Close() error {
	if l == nil || l.f == nil {
		return nil
	}
	err := l.f.Close() // closing the last descriptor drops the flock
	l.f = nil
	return err
}
