package source

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"
)

const tarScheme = "tar+"

// MaxShardSize bounds one tar shard (members are read by range, so a shard
// is never held whole).
const MaxShardSize = 1 << 40

// shardIndexers is how many shards are indexed at once.
const shardIndexers = 8

// shardStore is storage holding tar shards: the directory and S3 sources,
// read by range and, for indexing, as a stream.
type shardStore interface {
	list(ctx context.Context, maxSize int64) ([]Entry, error)
	readAt(ctx context.Context, shard Entry, off int64, buf []byte) error
	open(ctx context.Context, shard Entry) (io.ReadCloser, error)
	stream(ctx context.Context, shard Entry) (io.ReadCloser, error)
	Close() error
}

// Streamer is a source of tar shards that can also be read one whole shard
// at a time, front to back: the cheapest way to read every member.
type Streamer interface {
	// Stream opens shard (Key, Size and Tag as in a member's Entry: Shard,
	// ShardSize, Tag) for one sequential pass; a shard that is no longer
	// the version indexed fails with ErrChanged.
	Stream(ctx context.Context, shard Entry) (io.ReadCloser, error)
}

func openShards(norm string, opt Options) (shardStore, error) {
	opt.Progress = nil
	if strings.HasPrefix(norm, "s3://") {
		return openS3(norm, opt)
	}
	return OpenDir(strings.TrimPrefix(norm, "dir://"), opt)
}

// Tar serves the members of the tar shards (every *.tar object) below a
// directory or an S3 prefix: WebDataset's layout. Items are regular-file
// members, keyed SHARD/MEMBER, in shard order and then archive order.
type Tar struct {
	shards   shardStore
	spec     string
	leftOut  atomic.Int64
	progress *Progress
	// idle bounds how long one read of a shard being indexed may make no
	// progress (0: indexIdle): a shard that stopped sending held its
	// registration until the request's 10-minute deadline. (One that sends
	// a byte now and then still may: the registration's deadline bounds it.)
	idle time.Duration
}

// indexIdle is a tar shard index's idle bound: the node's default storage
// timeout.
const indexIdle = 30 * time.Second

// Close releases the storage.
func (t *Tar) Close() error { return t.shards.Close() }

// Where is the spec of the shards' directory opened, every symlink
// resolved; false for S3.
func (t *Tar) Where() (string, bool) {
	d, ok := t.shards.(*Dir)
	if !ok {
		return "", false
	}
	return d.Where(), true
}

// LeftOut is how many members the last List left out: not regular files,
// absolute names, ".." segments, names that cannot be keys, repeated names,
// members over MaxItemSize.
func (t *Tar) LeftOut() int { return int(t.leftOut.Load()) }

// List indexes every shard, several at once: headers only, skipping member
// data by seeking where storage can (files), one streaming read per shard
// where it cannot (S3). Its order is not bytewise by key: shards in order,
// then each shard's members as archived.
func (t *Tar) List(ctx context.Context) ([]Entry, error) {
	all, err := t.shards.list(ctx, MaxShardSize)
	if err != nil {
		return nil, err
	}
	var shards []Entry
	for _, e := range all {
		if strings.HasSuffix(e.Key, ".tar") {
			shards = append(shards, e)
		}
	}
	t.progress.Shards.Store(int64(len(shards)))
	members := make([][]Entry, len(shards))
	left := make([]int, len(shards))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(shardIndexers)
	for s, shard := range shards {
		g.Go(func() error {
			var err error
			members[s], left[s], err = t.index(gctx, shard)
			t.progress.Listed.Add(int64(len(members[s])))
			t.progress.ShardsDone.Add(1)
			t.progress.ShardBytes.Add(shard.Size)
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	dropClashes(shards, members, left)
	var out []Entry
	total := 0
	for s := range shards {
		out = append(out, members[s]...)
		total += left[s]
	}
	t.leftOut.Store(int64(total))
	return out, nil
}

// dropClashes leaves out (and counts in left) every member of a shard whose
// key lies under another shard's: S3 can hold objects d.tar and d.tar/x.tar
// (a directory cannot), and keys are SHARD/NAME, so member x.tar/a.jpg of
// the first and a.jpg of the second would both be d.tar/x.tar/a.jpg; their
// samples' keys could clash too (x.tar/c.cls and c.jpg are both sample
// d.tar/x.tar/c). A key must name one item, a sample key one sample.
func dropClashes(shards []Entry, members [][]Entry, left []int) {
	isShard := make(map[string]bool, len(shards))
	for _, shard := range shards {
		isShard[shard.Key] = true
	}
	for s, shard := range shards {
		for i := range len(shard.Key) {
			if shard.Key[i] == '/' && isShard[shard.Key[:i]] {
				left[s] += len(members[s])
				members[s] = nil
				break
			}
		}
	}
}

// index reads one shard's headers.
func (t *Tar) index(ctx context.Context, shard Entry) ([]Entry, int, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	rc, err := t.shards.open(ctx, shard)
	if err != nil {
		return nil, 0, err
	}
	defer rc.Close()
	idle := t.idle
	if idle <= 0 {
		idle = indexIdle
	}
	watchdog := time.AfterFunc(idle, func() { cancel(ErrTimeout) })
	defer watchdog.Stop()
	cr := &countingReader{r: rc, progress: func() { watchdog.Reset(idle) }}
	if s, ok := rc.(io.Seeker); ok {
		cr.s = s
	}
	tr := tar.NewReader(cr)
	var out []Entry
	seen := map[string]bool{}
	left := 0
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out, left, nil
		}
		if err != nil {
			if errors.Is(context.Cause(ctx), ErrTimeout) {
				return nil, 0, fmt.Errorf("index %s: no byte for %v at byte %d: %w", shard.Key, idle, cr.pos, ErrTimeout)
			}
			if ctx.Err() != nil {
				return nil, 0, ctx.Err()
			}
			return nil, 0, fmt.Errorf("%w: %s at byte %d: %w", ErrCorrupt, shard.Key, cr.pos, err)
		}
		name := memberName(hdr.Name)
		key := shard.Key + "/" + name
		if !regular(hdr) || ValidKey(name) != nil || ValidKey(key) != nil || seen[name] || hdr.Size > MaxItemSize {
			left++
			continue
		}
		if cr.pos+hdr.Size > shard.Size {
			return nil, 0, fmt.Errorf("%w: %s at byte %d: member %q of %d bytes runs past the shard's end (%d bytes)",
				ErrCorrupt, shard.Key, cr.pos, name, hdr.Size, shard.Size)
		}
		seen[name] = true
		out = append(out, Entry{Key: key, Size: hdr.Size, Tag: shard.Tag, Shard: shard.Key, ShardSize: shard.Size, Offset: cr.pos})
	}
}

// memberName drops the "./" that `tar -C dir .` puts before every name.
func memberName(name string) string {
	for strings.HasPrefix(name, "./") {
		name = name[2:]
	}
	return name
}

// regular reports whether a member's data is its bytes as stored: a regular
// file, not stored sparse (GNU sparse members in PAX records say so).
func regular(hdr *tar.Header) bool {
	if hdr.Typeflag != tar.TypeReg && hdr.Typeflag != tar.TypeRegA { //nolint:staticcheck // old archives use TypeRegA
		return false
	}
	for k := range hdr.PAXRecords {
		if strings.HasPrefix(k, "GNU.sparse.") {
			return false
		}
	}
	return true
}

// Read reads one member by range.
func (t *Tar) Read(ctx context.Context, e Entry, buf []byte) ([]byte, error) {
	if err := ValidKey(e.Key); err != nil {
		return nil, err
	}
	if e.Shard == "" || !strings.HasPrefix(e.Key, e.Shard+"/") || ValidKey(e.Shard) != nil {
		return nil, fmt.Errorf("read %s: %w: not a member of a shard", e.Key, ErrBadKey)
	}
	if e.Size < 0 || e.Size > MaxItemSize || e.Offset < 0 || e.Offset+e.Size > e.ShardSize {
		return nil, fmt.Errorf("read %s: size %d at %d out of range", e.Key, e.Size, e.Offset)
	}
	if int64(cap(buf)) < e.Size {
		buf = make([]byte, e.Size)
	}
	buf = buf[:e.Size]
	if err := t.shards.readAt(ctx, Entry{Key: e.Shard, Size: e.ShardSize, Tag: e.Tag}, e.Offset, buf); err != nil {
		return nil, err
	}
	return buf, nil
}

// Stream opens one shard for a sequential pass.
func (t *Tar) Stream(ctx context.Context, shard Entry) (io.ReadCloser, error) {
	if err := ValidKey(shard.Key); err != nil {
		return nil, err
	}
	return t.shards.stream(ctx, shard)
}

// countingReader knows the offset it has reached, which after tar's Next is
// where the member's data starts (archive/tar reads whole blocks, no more).
// It seeks only when the reader below can.
type countingReader struct {
	r        io.Reader
	s        io.Seeker
	pos      int64
	progress func() // after a read that gave bytes
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.pos += int64(n)
	if n > 0 && c.progress != nil {
		c.progress()
	}
	return n, err
}

var errNoSeek = errors.New("not seekable")

func (c *countingReader) Seek(off int64, whence int) (int64, error) {
	if c.s == nil {
		return 0, errNoSeek
	}
	p, err := c.s.Seek(off, whence)
	if err == nil {
		c.pos = p
	}
	return p, err
}
