package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"
	"golang.org/x/time/rate"
)

// Dir serves the regular files below a directory.
type Dir struct {
	root    *os.Root
	path    string
	limiter *rate.Limiter
	listed  *atomic.Int64
	// afterRead, in tests, runs between a read and its check: a writer
	// racing the read, on cue.
	afterRead func(key string)
}

// OpenDir opens the directory at path. Where says where the directory it
// opened really is: a symlink on the way may lead elsewhere by the time it
// is opened than when it was resolved, so --allow-source is checked on what
// was opened.
func OpenDir(path string, opt Options) (*Dir, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", path, err)
	}
	f, err := os.Open(real)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", path, err)
	}
	defer f.Close()
	at := real
	if opened, fdPath, ok := openedAt(f); ok {
		// The root is the directory f holds, not what real leads to now.
		real, at = opened, fdPath
	}
	root, err := os.OpenRoot(at)
	if err != nil {
		return nil, fmt.Errorf("source %s: %w", path, err)
	}
	d := &Dir{root: root, path: real, listed: &progressOf(opt).Listed}
	if opt.BytesPerSecond > 0 {
		// A small bucket (1/20 s of bandwidth): an idle source must not bank
		// seconds of reads and then serve them at memory speed.
		burst := int(min(max(opt.BytesPerSecond/20, 4<<10), 1<<20))
		d.limiter = rate.NewLimiter(rate.Limit(opt.BytesPerSecond), burst)
		d.limiter.AllowN(time.Now(), burst) // start empty
	}
	return d, nil
}

// Close releases the directory handle.
func (d *Dir) Close() error { return d.root.Close() }

// Where is the spec of the directory opened, every symlink resolved.
func (d *Dir) Where() string { return "dir://" + d.path }

// List walks the tree. Symlinks are followed only when they resolve to a
// regular file inside the root; files whose names cannot be keys are skipped.
func (d *Dir) List(ctx context.Context) ([]Entry, error) { return d.list(ctx, MaxItemSize) }

// listWorkers directories are read at once: a cold tree waits on the disk, a
// warm one on the fstatat per file.
const listWorkers = 8

// list lists files of at most maxSize bytes and fails on a larger one.
// Directories are read in parallel, each through a root of its own, so a
// file costs one fstatat beside it rather than a walk from the top.
func (d *Dir) list(ctx context.Context, maxSize int64) ([]Entry, error) {
	w := &dirWalk{d: d, maxSize: maxSize}
	g, ctx := errgroup.WithContext(ctx)
	g.SetLimit(listWorkers)
	w.g = g
	g.Go(func() error { return w.dir(ctx, "") })
	if err := g.Wait(); err != nil {
		return nil, fmt.Errorf("list %s: %w", d.path, err)
	}
	// Joined once: growing one slice of 10 M entries would copy it again and
	// again, each copy one long stretch the collector cannot interrupt.
	out := slices.Concat(w.dirs...)
	w.dirs = nil
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Key, b.Key) })
	return out, nil
}

type dirWalk struct {
	d       *Dir
	maxSize int64
	g       *errgroup.Group
	mu      sync.Mutex
	dirs    [][]Entry // each directory's files
}

// dir lists the directory rel ("" for the top) and starts on its
// subdirectories: on another goroutine while one is free, here otherwise.
func (w *dirWalk) dir(ctx context.Context, rel string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	name := rel
	if name == "" {
		name = "."
	}
	// The sub-root refuses a directory swapped for a symlink meanwhile.
	r, err := w.d.root.OpenRoot(name)
	if err != nil {
		return err
	}
	defer r.Close()
	f, err := r.Open(".")
	if err != nil {
		return err
	}
	defer f.Close()
	// Names alone: the types come from the fstatat each name needs anyway,
	// and a DirEntry per file would be garbage.
	names, err := f.Readdirnames(-1)
	if err != nil {
		return err
	}
	var found []Entry
	for _, name := range names {
		key := name
		if rel != "" {
			key = rel + "/" + name
		}
		// A name that cannot be part of a key leaves out all below it.
		if ValidKey(key) != nil {
			continue
		}
		mode, size, mtime, err := lstatAt(f, r, name)
		if err != nil {
			continue // gone meanwhile
		}
		// An if chain, not a tagless switch: Go's coverage gives a case
		// expression no block of its own, so mutation testing could not
		// tell whether a test reaches it.
		if mode.IsDir() {
			if !w.g.TryGo(func() error { return w.dir(ctx, key) }) {
				if err := w.dir(ctx, key); err != nil {
					return err
				}
			}
			continue
		} else if mode&fs.ModeSymlink != 0 {
			// Through the dataset's root: it follows the link but refuses
			// one that leaves it.
			fi, err := w.d.root.Stat(key)
			if err != nil || !fi.Mode().IsRegular() {
				continue
			}
			size, mtime = fi.Size(), fi.ModTime().UnixNano()
		} else if !mode.IsRegular() {
			continue
		}
		if size > w.maxSize {
			return fmt.Errorf("source %s: %s is %d bytes, over the %d-byte item limit", w.d.path, key, size, w.maxSize)
		}
		found = append(found, Entry{Key: key, Size: size, Tag: mtimeTag(mtime)})
	}
	w.d.listed.Add(int64(len(found)))
	w.mu.Lock()
	w.dirs = append(w.dirs, found)
	w.mu.Unlock()
	return nil
}

// mtimeTag is a directory entry's version fingerprint: its modification
// time in ns, folded to 32 bits (never 0, which means "no fingerprint":
// manifests registered before files carried one are checked by size alone).
// A file rewritten in place gets a new mtime, whatever its new size; the
// fold misses a rewrite only when the two mtimes fold alike (2^-32), and
// keeps the manifest at 4 bytes an item (catalog.Manifest.Stamps).
func mtimeTag(ns int64) uint64 {
	u := uint64(ns)
	return uint64(max(uint32(u^u>>32), 1))
}

// changed checks an open file against its manifest entry: the size and,
// where the manifest has one, the mtime it was registered with. One fstat,
// already paid for by openRegular.
func changed(key string, fi os.FileInfo, e Entry) error {
	if fi.Size() != e.Size {
		return fmt.Errorf("read %s: %w (%d bytes, registered at %d)", key, ErrChanged, fi.Size(), e.Size)
	}
	if e.Tag != 0 && mtimeTag(fi.ModTime().UnixNano()) != e.Tag {
		return fmt.Errorf("read %s: %w (modified at %s, after its registration)", key, ErrChanged, fi.ModTime().UTC().Format(time.RFC3339Nano))
	}
	return nil
}

// Check tells whether the file behind e is still the one registered (size
// and mtime; ErrChanged when not) without reading it: one fstatat, cheap
// enough for a warm-up to ask of the items it already holds.
func (d *Dir) Check(_ context.Context, e Entry) error {
	if err := ValidKey(e.Key); err != nil {
		return err
	}
	f, fi, err := d.openRegular(e.Key)
	if err != nil {
		return err
	}
	f.Close()
	return changed(e.Key, fi, e)
}

// Read returns the file's bytes and fails with ErrChanged when its size or
// mtime no longer matches the manifest, or when it was written while it was
// read. A read during which only the ctime moved (a chmod, a chown, a link,
// or a write with its mtime set back) is read once more: the second must
// see nothing move.
func (d *Dir) Read(ctx context.Context, e Entry, buf []byte) ([]byte, error) {
	b, err := d.readOnce(ctx, e, buf)
	if errors.Is(err, errAttrsMoved) {
		b, err = d.readOnce(ctx, e, buf)
	}
	return b, err
}

func (d *Dir) readOnce(ctx context.Context, e Entry, buf []byte) ([]byte, error) {
	key, size := e.Key, e.Size
	if err := ValidKey(key); err != nil {
		return nil, err
	}
	if size < 0 || size > MaxItemSize {
		return nil, fmt.Errorf("read %s: size %d out of range", key, size)
	}
	if err := d.throttle(ctx, key, size); err != nil {
		return nil, err
	}
	f, fi, err := d.openRegular(key)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := changed(key, fi, e); err != nil {
		return nil, err
	}
	if int64(cap(buf)) < size {
		buf = make([]byte, size)
	}
	buf = buf[:size]
	n, err := io.ReadFull(f, buf)
	if err == nil { // the file may have grown: one more byte says so
		var more [1]byte
		if m, _ := f.Read(more[:]); m > 0 {
			return nil, fmt.Errorf("read %s: %w (longer than the manifest's %d bytes)", key, ErrChanged, size)
		}
	} else if !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("read %s: %w", key, err)
	}
	if int64(n) != size {
		return nil, fmt.Errorf("read %s: %w (manifest says %d bytes)", key, ErrChanged, size)
	}
	if d.afterRead != nil {
		d.afterRead(key)
	}
	if err := unchangedSince(f, fi, key); err != nil {
		return nil, err
	}
	return buf, nil
}

// unchangedSince fails with ErrChanged when f is no longer the version fi
// showed before it was read: the size and mtime were checked before the
// read, so a file rewritten in place while it was read was served torn
// (half the old bytes, half the new) and kept. When only its ctime moved,
// the error is also errAttrsMoved.
func unchangedSince(f *os.File, fi os.FileInfo, key string) error {
	now, err := f.Stat()
	if err != nil {
		return fmt.Errorf("read %s: %w", key, err)
	}
	if same, attrsOnly := sameVersion(fi, now); attrsOnly {
		return fmt.Errorf("read %s: %w: %w", key, ErrChanged, errAttrsMoved)
	} else if !same {
		return fmt.Errorf("read %s: %w (written while it was read)", key, ErrChanged)
	}
	return nil
}

// errAttrsMoved: only a file's ctime (or inode) moved while it was read:
// written with its mtime set back, or just chmod-ed, chown-ed or linked.
var errAttrsMoved = errors.New("its ctime moved while it was read (written, or its attributes changed)")

// throttle waits until the rate limit (if any) allows reading size bytes.
func (d *Dir) throttle(ctx context.Context, key string, size int64) error {
	for left := int(size); d.limiter != nil && left > 0; {
		n := min(left, d.limiter.Burst())
		if err := d.limiter.WaitN(ctx, n); err != nil {
			return fmt.Errorf("read %s: %w", key, err)
		}
		left -= n
	}
	return nil
}

// openRegular opens key for reading, refusing anything but a regular file.
func (d *Dir) openRegular(key string) (*os.File, os.FileInfo, error) {
	// O_NONBLOCK: opening a FIFO (or a device) put where a file was must
	// not block; it is refused below. The root keeps the open inside the
	// dataset, symlinks included.
	f, err := d.root.OpenFile(filepath.FromSlash(key), os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if gone(err) {
		return nil, nil, fmt.Errorf("read %s: %w: %w", key, ErrChanged, err)
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read %s: %w", key, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("read %s: %w", key, err)
	}
	if !fi.Mode().IsRegular() {
		f.Close()
		return nil, nil, fmt.Errorf("read %s: %w: no longer a regular file (%v)", key, ErrChanged, fi.Mode().Type())
	}
	return f, fi, nil
}

// gone reports whether an open failed because the registered file is no
// longer there as a file inside the dataset: deleted, a directory on its
// path replaced by a file, or a symlink put in its place that loops or leads
// out of the dataset (os.Root refuses it). That is a changed source (409,
// and a warm-up drops the held copy), not a failing one; other errors (too
// many open files, permissions) are the machine's, and a held copy stays.
func gone(err error) bool {
	if err == nil {
		return false
	}
	var pe *os.PathError
	return errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) || errors.Is(err, syscall.ELOOP) ||
		errors.As(err, &pe) && pe.Err.Error() == "path escapes from parent" // os.Root's, unexported
}

// openShard opens a shard file that must still be the size it was indexed
// at: a rewritten shard moves its members. fi is its fstat, to check the
// reads against (unchangedSince).
func (d *Dir) openShard(shard Entry) (*os.File, os.FileInfo, error) {
	f, fi, err := d.openRegular(shard.Key)
	if err != nil {
		return nil, nil, err
	}
	if err := changed(shard.Key, fi, shard); err != nil {
		f.Close()
		return nil, nil, err
	}
	return f, fi, nil
}

// readAt reads len(buf) bytes at off of a shard file, which must still be
// the size it was indexed at (a rewritten shard moves its members).
func (d *Dir) readAt(ctx context.Context, shard Entry, off int64, buf []byte) error {
	err := d.readAtOnce(ctx, shard, off, buf)
	if errors.Is(err, errAttrsMoved) { // once more, as Read does
		err = d.readAtOnce(ctx, shard, off, buf)
	}
	return err
}

func (d *Dir) readAtOnce(ctx context.Context, shard Entry, off int64, buf []byte) error {
	if err := d.throttle(ctx, shard.Key, int64(len(buf))); err != nil {
		return err
	}
	f, fi, err := d.openShard(shard)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.ReadAt(buf, off); err != nil {
		return fmt.Errorf("read %s at %d: %w", shard.Key, off, err)
	}
	if d.afterRead != nil {
		d.afterRead(shard.Key)
	}
	return unchangedSince(f, fi, shard.Key)
}

// stream opens a shard file for one sequential pass; it must still be the
// size it was indexed at, and the read rate obeys the source's throttle.
func (d *Dir) stream(ctx context.Context, shard Entry) (io.ReadCloser, error) {
	f, fi, err := d.openShard(shard)
	if err != nil {
		return nil, err
	}
	c := &checkedFile{f: f, fi: fi, key: shard.Key}
	if d.limiter == nil {
		return c, nil
	}
	return &throttledFile{f: c, d: d, ctx: ctx, key: shard.Key}, nil
}

// checkedFile is a shard read in one pass whose every read is checked
// against the shard's version before its bytes are handed on (one fstat a
// read: a warm-up reads 256 KiB a time), so a shard rewritten during the pass
// fails it with ErrChanged instead of handing on members of two versions. A
// pass cannot be read again, so a move of the ctime alone (a chmod of the
// shard during a pass of minutes) does not fail it; a write with the mtime
// set back during a pass goes unseen.
type checkedFile struct {
	f   *os.File
	fi  os.FileInfo
	key string
}

func (c *checkedFile) Read(p []byte) (int, error) {
	n, err := c.f.Read(p)
	if cerr := unchangedSince(c.f, c.fi, c.key); cerr != nil && !errors.Is(cerr, errAttrsMoved) {
		return 0, cerr
	}
	return n, err
}

func (c *checkedFile) Close() error { return c.f.Close() }

// throttledFile is a shard read at the source's rate. It offers Read and
// Close only: an embedded *os.File would also offer WriteTo, which io.Copy
// prefers and which reads the whole file unthrottled.
type throttledFile struct {
	f   *checkedFile
	d   *Dir
	ctx context.Context
	key string
}

func (t *throttledFile) Close() error { return t.f.Close() }

func (t *throttledFile) Read(p []byte) (int, error) {
	n, err := t.f.Read(p)
	if werr := t.d.throttle(t.ctx, t.key, int64(n)); werr != nil { // 0 bytes never wait
		return n, werr
	}
	return n, err
}

// open opens a shard file for indexing: seekable, so headers are read and
// member data is skipped.
func (d *Dir) open(_ context.Context, shard Entry) (io.ReadCloser, error) {
	f, _, err := d.openRegular(shard.Key)
	return f, err
}
