package source

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/minio/minio-go/v7"
)

// Probe checks, cheaply, that spec's storage can be listed: a directory
// that exists, is a directory and can be read (its first entry), or a
// bucket whose prefix answers a one-key listing. It does not list the
// dataset: a node checks its --dataset flags with it at start, before a
// listing of millions of items would tell the same thing minutes later, so
// a wrong path stops the node with the reason instead of leaving it running
// and never ready. An empty directory or prefix passes: it lists, to nothing.
func Probe(ctx context.Context, spec string, opt Options) error {
	norm, err := Normalize(spec)
	if err != nil {
		return err
	}
	norm = strings.TrimPrefix(norm, tarScheme)
	if strings.HasPrefix(norm, "s3://") {
		s, err := openS3(norm, opt)
		if err != nil {
			return err
		}
		defer s.Close()
		ctx, cancel := context.WithCancel(ctx)
		defer cancel() // stops the listing after its first page
		for o := range s.core.ListObjectsIter(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix, MaxKeys: 1}) {
			if o.Err != nil {
				return s.storageErr("list", s.prefix, o.Err)
			}
			break
		}
		return nil
	}
	d, err := OpenDir(strings.TrimPrefix(norm, "dir://"), opt)
	if err != nil {
		return err
	}
	defer d.Close()
	top, err := d.root.Open(".")
	if err != nil {
		return fmt.Errorf("source %s: %w", d.path, err)
	}
	defer top.Close()
	if _, err := top.ReadDir(1); err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("source %s: %w", d.path, err)
	}
	return nil
}
