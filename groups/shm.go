package groups

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"

	"stallfree/handoff"
	"stallfree/shmdir"
)

// Staged batches in shared memory (Config.ShmDir, a tmpfs such as /dev/shm):
// each batch is one file, written once. The jobs on this host map it
// read-only (GET …?map=1 over the node's Unix socket answers its path), so
// a batch is in memory once per host however many jobs read it, and no
// bytes cross a socket. A reader opens the file as soon as it has the path;
// a dropped batch's file stays for Linger before it is removed, so that a
// reader told the path finds it (one too late is told the batch was dropped,
// and makes it itself: Staged.Open, ErrGone). Once removed, its pages go back to
// the system when the last reader unmaps them, or exits: a killed job leaks
// nothing.

// Staged is a staged batch as a reader gets it: its bytes, or the file in
// shared memory holding them.
type Staged struct {
	Data []byte
	Path string
	Size int64
	// Ino and Dev, when Ino is not 0, are the inode and device of the file
	// Path names when it names a descriptor (a handed-over batch's
	// /proc/PID/fd/N): once the batch is dropped and its linger over, the
	// number may name another file.
	Ino, Dev uint64
	// Version is the group definition's the batch was staged under (set on
	// what GetStaged returns).
	Version uint64
}

// ErrGone is a staged batch's file let go before it was opened: the batch
// was dropped meanwhile and its linger is over. The asker makes the batch
// itself, as for any batch dropped.
var ErrGone = fmt.Errorf("%w: the batch was dropped and its file let go", ErrNotStaged)

// Bytes are the batch's bytes (read from its file when it has one).
func (s Staged) Bytes() ([]byte, error) {
	if s.Path == "" {
		return s.Data, nil
	}
	f, err := s.Open()
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(f)
}

// Open opens the batch's file, if it is still the batch's: ErrGone when it
// was let go (removed, or a handed-over file's descriptor closed and its
// number perhaps reused, which Ino and Dev tell). Any other failure (out
// of descriptors) is itself.
func (s Staged) Open() (*os.File, error) {
	var f *os.File
	var err error
	if s.Ino != 0 {
		f, err = handoff.Reopen(s.Path, s.Ino, s.Dev)
	} else {
		f, err = os.Open(s.Path)
	}
	if err != nil && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, handoff.ErrNotTheFile)) {
		return nil, fmt.Errorf("%w (%v)", ErrGone, err)
	}
	return f, err
}

// DefaultLinger is how long a dropped batch's file stays. A reader opens
// the file as soon as it has the answer naming it, so a moment will do; one
// that is later is answered that the batch was dropped and makes it itself
// (its augmentation is seeded: the same bytes). Every staged batch is new
// memory, and what a file holds while it lingers is memory the next batches
// cannot reuse: with 30 s (the old default) a group staging 140 MB/s kept
// 4 GB of dropped batches, and each new batch went into pages freed long
// ago, which a VM that hands free memory back to its host must fault in
// again: 19 ms of CPU to write a 9 MB batch, against 1.5 ms into pages
// freed a moment before (BENCHMARKS.md, "Dropped batches' files").
const DefaultLinger = 250 * time.Millisecond

// shmPrefix names this node's files, so that a restarted node removes what
// it left behind (and nothing of another node's).
func (s *Service) shmPrefix() string {
	return "stallfree-" + s.host.Name() + "-" + s.cfg.ShmTag + "-"
}

// writeShm writes a batch to a new file of its own, readable by this user
// only.
func (s *Service) writeShm(group string, pos uint64, data []byte) (string, error) {
	f, err := shmdir.Create(s.cfg.ShmDir, fmt.Sprintf("%s%s-%d-", s.shmPrefix(), group, pos))
	if err != nil {
		return "", err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

type lingering struct {
	path string
	held io.Closer // a handed-over file: closed instead of removed
	at   time.Time
}

// retire schedules a dropped batch's file for removal. Caller holds s.mu.
func (s *Service) retire(b *batch) {
	if b.path != "" {
		s.linger = append(s.linger, lingering{path: b.path, held: b.held, at: time.Now().Add(s.cfg.Linger)})
	}
}

// removeDue removes the files whose time is up (all of them when now is
// zero). Caller holds s.mu.
func (s *Service) removeDue(now time.Time) {
	keep := s.linger[:0]
	for _, l := range s.linger {
		if now.IsZero() || !now.Before(l.at) {
			if l.held != nil {
				l.held.Close()
			} else {
				os.Remove(l.path)
			}
			continue
		}
		keep = append(keep, l)
	}
	s.linger = keep
}

// removeStaleShm removes the files a previous run of this node left (it
// died without removing them).
func (s *Service) removeStaleShm() {
	if n := shmdir.RemoveStale(s.cfg.ShmDir, s.shmPrefix()); n > 0 {
		s.cfg.Logger.Info("removed staged batches a previous run left in shared memory", "files", n, "dir", s.cfg.ShmDir)
	}
}
