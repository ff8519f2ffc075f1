package handoff

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"golang.org/x/sys/unix"

	"stallfree/internal/testutil"
)

func seals(t *testing.T, f *os.File) int {
	t.Helper()
	s, err := unix.FcntlInt(f.Fd(), unix.F_GET_SEALS, 0)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// A taken file holds the writer's bytes, opens by its Path, and can no
// longer be written, resized or mapped writable by anyone, its writer
// included; closed, its Path opens nothing.
func TestTakeSealsTheWritersBytes(t *testing.T) {
	data := bytes.Repeat([]byte("staged batch "), 1000)
	w, ino := testutil.Memfd(t, data, unix.MFD_ALLOW_SEALING)
	h, err := Take(os.Getpid(), int(w.Fd()), ino, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	if h.Size != int64(len(data)) {
		t.Fatalf("size %d, want %d", h.Size, len(data))
	}
	if got, err := h.ReadAll(); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("ReadAll: %d bytes, %v", len(got), err)
	}
	if got, err := os.ReadFile(h.Path); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("reading %s: %d bytes, %v", h.Path, len(got), err)
	}
	if _, err := w.WriteAt([]byte("X"), 0); !errors.Is(err, syscall.EPERM) {
		t.Errorf("the writer wrote after the hand-off: %v", err)
	}
	if err := w.Truncate(1); !errors.Is(err, syscall.EPERM) {
		t.Errorf("the writer shrank it after the hand-off: %v", err)
	}
	if err := w.Truncate(int64(len(data)) * 2); !errors.Is(err, syscall.EPERM) {
		t.Errorf("the writer grew it after the hand-off: %v", err)
	}
	if m, err := syscall.Mmap(int(w.Fd()), 0, len(data), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED); err == nil {
		syscall.Munmap(m)
		t.Error("the writer mapped it writable after the hand-off")
	}
	if got := seals(t, w); got&unix.F_SEAL_SEAL == 0 {
		t.Errorf("seals %#x: the seals can still change", got)
	}
	path := h.Path
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if f, err := os.Open(path); err == nil {
		// The descriptor number may have been reused by then; it must not
		// be the handed-over file.
		var st unix.Stat_t
		unix.Fstat(int(f.Fd()), &st)
		f.Close()
		if st.Ino == ino {
			t.Errorf("%s still opens the file after Close", path)
		}
	}
}

// An empty batch is a file like any other.
func TestTakeEmpty(t *testing.T) {
	w, ino := testutil.Memfd(t, nil, unix.MFD_ALLOW_SEALING)
	h, err := Take(os.Getpid(), int(w.Fd()), ino, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if got, err := h.ReadAll(); err != nil || len(got) != 0 || h.Size != 0 {
		t.Fatalf("ReadAll of an empty file: %q, %v (size %d)", got, err, h.Size)
	}
}

// A file that cannot be taken over is refused, says why, and is left as
// it was: no seal added.
func TestTakeRefuses(t *testing.T) {
	data := []byte("0123456789")
	t.Run("mapped writable", func(t *testing.T) {
		w, ino := testutil.Memfd(t, data, unix.MFD_ALLOW_SEALING)
		m, err := syscall.Mmap(int(w.Fd()), 0, len(data), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Munmap(m)
		refused(t, int(w.Fd()), ino, 100, "unmap it")
		if s := seals(t, w); s != 0 {
			t.Errorf("seals %#x added to a refused file", s)
		}
	})
	t.Run("not open to sealing", func(t *testing.T) {
		w, ino := testutil.Memfd(t, data, 0)
		refused(t, int(w.Fd()), ino, 100, "MFD_ALLOW_SEALING")
	})
	t.Run("another inode", func(t *testing.T) {
		w, ino := testutil.Memfd(t, data, unix.MFD_ALLOW_SEALING)
		refused(t, int(w.Fd()), ino+1, 100, "not the file named")
		if s := seals(t, w); s != 0 {
			t.Errorf("seals %#x added to a refused file", s)
		}
	})
	t.Run("too large", func(t *testing.T) {
		w, ino := testutil.Memfd(t, data, unix.MFD_ALLOW_SEALING)
		refused(t, int(w.Fd()), ino, int64(len(data))-1, "at most 9")
	})
	t.Run("a file in a directory", func(t *testing.T) {
		f, err := os.Create(filepath.Join(t.TempDir(), "batch"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var st unix.Stat_t
		unix.Fstat(int(f.Fd()), &st)
		refused(t, int(f.Fd()), st.Ino, 100, "memfd")
	})
	t.Run("no such descriptor", func(t *testing.T) {
		refused(t, 1<<20, 1, 100, "opening it")
	})
	t.Run("a device", func(t *testing.T) {
		f, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		var st unix.Stat_t
		unix.Fstat(int(f.Fd()), &st)
		refused(t, int(f.Fd()), st.Ino, 100, "want a regular file")
	})
	t.Run("no such process", func(t *testing.T) {
		refusedFrom(t, 0, 3, 1, 100, "process 0")
		refusedFrom(t, -1, 3, 1, 100, "process -1")
	})
	t.Run("a negative descriptor", func(t *testing.T) {
		refused(t, -1, 1, 100, "descriptor -1")
	})
}

func refused(t *testing.T, fd int, ino uint64, maxSize int64, why string) {
	t.Helper()
	refusedFrom(t, os.Getpid(), fd, ino, maxSize, why)
}

func refusedFrom(t *testing.T, pid, fd int, ino uint64, maxSize int64, why string) {
	t.Helper()
	h, err := Take(pid, fd, ino, maxSize)
	if err == nil {
		h.Close()
		t.Fatalf("taken; want refused (%s)", why)
	}
	if !errors.Is(err, ErrRefused) || !bytes.Contains([]byte(err.Error()), []byte(why)) {
		t.Fatalf("error %q: want ErrRefused saying %q", err, why)
	}
}

// wrapped stands in for a listener's connection wrapper.
type wrapped struct{ net.Conn }

func (w wrapped) Unwrap() net.Conn { return w.Conn }

// PeerPID is the connecting process's, through wrappers; a TCP connection
// has none.
func TestPeerPID(t *testing.T) {
	ln, err := net.Listen("unix", filepath.Join(t.TempDir(), "s"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	dialed, err := net.Dial("unix", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	accepted, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer accepted.Close()
	if pid, err := PeerPID(wrapped{accepted}); err != nil || pid != os.Getpid() {
		t.Fatalf("PeerPID: %d, %v; want %d", pid, err, os.Getpid())
	}
	tl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tl.Close()
	tc, err := net.Dial("tcp", tl.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer tc.Close()
	if _, err := PeerPID(tc); !errors.Is(err, ErrRefused) {
		t.Fatalf("PeerPID over TCP: %v, want ErrRefused", err)
	}
}

// Reopen opens a taken file by its Path only while the Path still names
// it: once the file is closed and the descriptor number reused by another
// file, or by a pipe (whose plain open would block), it is an error.
func TestReopenChecksTheFileIsStillTheOneTaken(t *testing.T) {
	data := []byte("a staged batch")
	w, ino := testutil.Memfd(t, data, unix.MFD_ALLOW_SEALING)
	h, err := Take(os.Getpid(), int(w.Fd()), ino, int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	f, err := Reopen(h.Path, h.Ino, h.Dev)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(f)
	if err != nil || !bytes.Equal(got, data) {
		t.Fatalf("reopened: %q, %v", got, err)
	}
	if mode, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0); err != nil || mode&unix.O_ACCMODE != unix.O_RDONLY {
		t.Errorf("reopened with flags %#o, %v: want read-only", mode, err)
	}
	f.Close()
	if _, err := Reopen(h.Path, h.Ino, h.Dev+1); !errors.Is(err, ErrNotTheFile) {
		t.Errorf("the same inode on another device: %v", err)
	}
	path := h.Path
	fd := int(h.f.Fd())
	other, _ := testutil.Memfd(t, data, 0) // opened first: its own number is not fd
	if err := h.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := Reopen(path, ino, h.Dev); err == nil {
		t.Error("reopened after Close")
	}
	// The number reused: by another memfd, then by a pipe's read end.
	if err := unix.Dup2(int(other.Fd()), fd); err != nil {
		t.Fatal(err)
	}
	if _, err := Reopen(path, ino, h.Dev); !errors.Is(err, ErrNotTheFile) {
		t.Errorf("another file under the same number: %v", err)
	}
	var p [2]int
	if err := unix.Pipe2(p[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(p[0])
	defer unix.Close(p[1])
	if err := unix.Dup2(p[0], fd); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fd)
	if _, err := Reopen(path, ino, h.Dev); !errors.Is(err, ErrNotTheFile) {
		t.Errorf("a pipe under the same number: %v", err)
	}
}
