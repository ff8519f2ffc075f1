// Package handoff takes over a file that a process on this host has
// filled in its own memory and names in a request over the node's Unix
// socket: a memfd (memfd_create with MFD_ALLOW_SEALING). The node opens
// the writer's descriptor through /proc, seals the file against every
// write, shrink and growth, and from then on holds it as if it had written
// it itself. The bytes are copied once, by their writer, into memory the
// whole host maps; the node neither receives nor writes them.
//
// Why the seal and not a copy: the writer keeps its descriptor until the
// node answers, and could write on after it. F_SEAL_WRITE stops that for
// every descriptor and mapping, the writer's included, and the kernel
// refuses it while a writable shared mapping exists: once Take returns,
// the bytes are fixed for good.
package handoff

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrNotTheFile is a path that names another file than the one expected
// (Reopen): a descriptor number reused since.
var ErrNotTheFile = errors.New("not the file named")

// ErrRefused is the cause of every error for a file that cannot be taken
// over (the caller's fault: a 400).
var ErrRefused = errors.New("handoff refused")

// sealed are the seals that fix a file's bytes.
const sealed = unix.F_SEAL_WRITE | unix.F_SEAL_SHRINK | unix.F_SEAL_GROW

// File is a sealed file taken over from a writer. Path opens it from any
// process on this host that may read this process's descriptors (same
// user): /proc/PID/fd/N of this process.
type File struct {
	f    *os.File
	Size int64
	Path string
	// Ino and Dev are the file's inode and device: Path names a descriptor
	// number, which names another file once this one is closed and the
	// number reused.
	Ino, Dev uint64
}

// Take opens descriptor fd of process pid, which must be the memfd with
// inode ino (a check that the descriptor is still the one the writer
// named), seals it and returns it. A file larger than maxSize, not a
// memfd open to sealing, or still mapped writable is refused (ErrRefused),
// and nothing is kept.
func Take(pid, fd int, ino uint64, maxSize int64) (*File, error) {
	f, err := openRegular(pid, fd, ino)
	if err != nil {
		return nil, fmt.Errorf("%w: descriptor %d of process %d: %v", ErrRefused, fd, pid, err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: descriptor %d of process %d: %v", ErrRefused, fd, pid, err)
	}
	h := &File{f: f, Ino: ino, Dev: st.Dev}
	if err := h.seal(maxSize); err != nil {
		f.Close()
		return nil, fmt.Errorf("%w: descriptor %d of process %d: %v", ErrRefused, fd, pid, err)
	}
	h.Path = fmt.Sprintf("/proc/%d/fd/%d", os.Getpid(), f.Fd())
	return h, nil
}

// openRegular opens, read-write, what descriptor fd of process pid refers
// to, if it is a regular file with inode ino. It looks first through an
// O_PATH descriptor, which opens nothing (a device's open can act: rewind a
// tape, arm a watchdog), and then reopens that very file, so the check and
// the open cannot see different files. A pid or fd out of range names
// nothing under /proc.
func openRegular(pid, fd int, ino uint64) (*os.File, error) {
	return openChecked(fmt.Sprintf("/proc/%d/fd/%d", pid, fd), ino, nil, os.O_RDWR)
}

// Reopen opens for reading the file a File's Path names, if it still is
// that file (inode ino on device dev; else ErrNotTheFile). Path names a
// descriptor number of this process, which names another file (or a
// socket, whose open would fail, or a pipe, whose open would block) once
// the File is closed and the number reused; the inode alone could match a
// file of another file system.
func Reopen(path string, ino, dev uint64) (*os.File, error) {
	return openChecked(path, ino, &dev, os.O_RDONLY)
}

// openChecked opens name (flag) if it is a regular file with inode ino (and,
// unless dev is nil, on device *dev).
func openChecked(name string, ino uint64, dev *uint64, flag int) (*os.File, error) {
	path, err := unix.Open(name, unix.O_PATH|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening it: %w", err)
	}
	defer unix.Close(path)
	var st unix.Stat_t
	if err := unix.Fstat(path, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Ino != ino || (dev != nil && st.Dev != *dev) {
		return nil, fmt.Errorf("%w (mode %#o, inode %d on device %d; want a regular file, inode %d)", ErrNotTheFile, st.Mode, st.Ino, st.Dev, ino)
	}
	return os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", path), flag, 0)
}

func (h *File) seal(maxSize int64) error {
	var st unix.Stat_t
	fd := uintptr(h.f.Fd())
	have, err := unix.FcntlInt(fd, unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("not a memfd: %v", err)
	}
	if have&sealed != sealed {
		_, err := unix.FcntlInt(fd, unix.F_ADD_SEALS, sealed|unix.F_SEAL_SEAL)
		switch {
		case errors.Is(err, syscall.EBUSY):
			return errors.New("still mapped writable by its writer: unmap it before handing it over")
		case errors.Is(err, syscall.EPERM):
			return errors.New("cannot be sealed: create it with memfd_create(..., MFD_ALLOW_SEALING)")
		case err != nil:
			return fmt.Errorf("sealing: %v", err)
		}
	}
	// The size is read after the seals: before them the writer could still
	// change it.
	if err := unix.Fstat(int(fd), &st); err != nil {
		return err
	}
	if st.Size > maxSize {
		return fmt.Errorf("%d bytes; at most %d", st.Size, maxSize)
	}
	h.Size = st.Size
	return nil
}

// ReadAll reads the file's bytes (for a copy that must leave the host).
func (h *File) ReadAll() ([]byte, error) {
	b := make([]byte, h.Size)
	if n, err := h.f.ReadAt(b, 0); n < len(b) {
		return nil, fmt.Errorf("reading the handed-over file: %w", err)
	}
	return b, nil
}

// Close gives the file up. Its memory goes back to the system once every
// process that opened or mapped it has let go.
func (h *File) Close() error { return h.f.Close() }

// PeerPID is the process at the other end of a Unix-socket connection (as
// it was when it connected), through any wrappers that have Unwrap.
func PeerPID(c net.Conn) (int, error) {
	for {
		u, ok := c.(interface{ Unwrap() net.Conn })
		if !ok {
			break
		}
		c = u.Unwrap()
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return 0, fmt.Errorf("%w: not a Unix-socket connection", ErrRefused)
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) { cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return 0, err
	}
	if cerr != nil {
		return 0, fmt.Errorf("the peer's credentials: %w", cerr)
	}
	return int(cred.Pid), nil
}
