//go:build !unix

package source

import (
	"io/fs"
	"os"
)

// lstatAt is the type, size and modification time (ns) of name in the directory r is rooted at,
// without following a symlink.
func lstatAt(_ *os.File, r *os.Root, name string) (fs.FileMode, int64, int64, error) {
	fi, err := r.Lstat(name)
	if err != nil {
		return 0, 0, 0, err
	}
	return fi.Mode().Type(), fi.Size(), fi.ModTime().UnixNano(), nil
}

// openedAt: no /proc here; the caller keeps the path it resolved.
func openedAt(*os.File) (string, string, bool) { return "", "", false }

// sameVersion reports whether two fstats of one open file show the same
// version of it: size and mtime alike.
func sameVersion(a, b fs.FileInfo) (same, attrsOnly bool) {
	return a.Size() == b.Size() && a.ModTime().Equal(b.ModTime()), false
}
