package source

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"

	"github.com/minio/minio-go/v7"
	"golang.org/x/sync/errgroup"
)

// uploaders is how many objects an upload writes at once.
const uploaders = 8

// Upload copies every regular file below dir to s3://BUCKET/PREFIX (keys are
// paths relative to dir), making the bucket when it is missing. It is how
// demo and test data get into an S3 server (the compose file's MinIO); a
// dataset is then registered from the prefix like any other. uploaded counts
// objects as they land.
func Upload(ctx context.Context, dir, dest string, cfg S3Config, uploaded *atomic.Int64) (bytes int64, err error) {
	norm, err := Normalize(dest)
	if err != nil || !strings.HasPrefix(norm, "s3://") {
		return 0, fmt.Errorf("upload to %q: want s3://BUCKET[/PREFIX]", dest)
	}
	s, err := openS3(norm, Options{S3: cfg})
	if err != nil {
		return 0, err
	}
	ok, err := s.core.BucketExists(ctx, s.bucket)
	if err != nil {
		return 0, s.storageErr("find bucket", "", err)
	}
	if !ok {
		if err := s.core.MakeBucket(ctx, s.bucket, minio.MakeBucketOptions{Region: cfg.Region}); err != nil {
			return 0, s.storageErr("make bucket", "", err)
		}
	}
	// The directory is listed as a dataset would be: the same keys, the
	// same rules for names and links.
	d, err := OpenDir(dir, Options{})
	if err != nil {
		return 0, err
	}
	defer d.Close()
	entries, err := d.List(ctx)
	if err != nil {
		return 0, err
	}
	var total atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(uploaders)
	for _, e := range entries {
		g.Go(func() error {
			f, fi, err := d.openRegular(e.Key)
			if err != nil {
				return err
			}
			defer f.Close()
			size := fi.Size()
			if _, err := s.core.Client.PutObject(gctx, s.bucket, s.prefix+e.Key, f, size, minio.PutObjectOptions{}); err != nil {
				return s.storageErr("put", s.prefix+e.Key, err)
			}
			total.Add(size)
			if uploaded != nil {
				uploaded.Add(1)
			}
			return nil
		})
	}
	err = g.Wait()
	return total.Load(), err
}
