//go:build unix

package source

import (
	"errors"
	"io/fs"
	"os"
	"strconv"
	"syscall"

	"golang.org/x/sys/unix"
)

// lstatAt is the type, size and modification time (ns) of name in the open directory dir, without
// following a symlink: one fstatat and no garbage, which matters when a
// listing runs over 10 M files and every allocation feeds the collector.
func lstatAt(dir *os.File, _ *os.Root, name string) (fs.FileMode, int64, int64, error) {
	var st unix.Stat_t
	for {
		err := unix.Fstatat(int(dir.Fd()), name, &st, unix.AT_SYMLINK_NOFOLLOW)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return 0, 0, 0, &fs.PathError{Op: "fstatat", Path: dir.Name() + "/" + name, Err: err}
		}
		break
	}
	var mode fs.FileMode
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFREG:
	case unix.S_IFDIR:
		mode = fs.ModeDir
	case unix.S_IFLNK:
		mode = fs.ModeSymlink
	default:
		mode = fs.ModeIrregular
	}
	return mode, st.Size, st.Mtim.Nano(), nil
}

// openedAt is where the directory f really is, as the kernel has it open
// (/proc/self/fd names the very directory, whatever its path now leads
// to), and that path to open it again by (fdPath). ok is false where there
// is no /proc.
func openedAt(f *os.File) (real, fdPath string, ok bool) {
	fdPath = "/proc/self/fd/" + strconv.Itoa(int(f.Fd()))
	real, err := os.Readlink(fdPath)
	return real, fdPath, err == nil
}

// sameVersion reports whether two fstats of one open file show the same
// version of it: size, mtime and ctime alike. ctime moves on every write and
// no user can set it, so a file written while it was read (and its mtime
// set back, even) shows; but it also moves on a chmod, a chown or a link,
// so attrsOnly says when only it (or the inode) differs.
func sameVersion(a, b fs.FileInfo) (same, attrsOnly bool) {
	if a.Size() != b.Size() || !a.ModTime().Equal(b.ModTime()) {
		return false, false
	}
	sa, okA := a.Sys().(*syscall.Stat_t)
	sb, okB := b.Sys().(*syscall.Stat_t)
	if !okA || !okB || sa.Ctim == sb.Ctim && sa.Ino == sb.Ino {
		return true, false
	}
	return false, true
}
