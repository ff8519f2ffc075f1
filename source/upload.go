package source

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
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
	var total atomic.Int64
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(uploaders)
	err = filepath.WalkDir(dir, func(p string, de fs.DirEntry, err error) error {
		if err != nil || !de.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if ValidKey(key) != nil {
			return nil // a name no dataset could serve
		}
		g.Go(func() error {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			defer f.Close()
			fi, err := f.Stat()
			if err != nil {
				return err
			}
			if _, err := s.core.Client.PutObject(gctx, s.bucket, s.prefix+key, f, fi.Size(), minio.PutObjectOptions{}); err != nil {
				return s.storageErr("put", s.prefix+key, err)
			}
			total.Add(fi.Size())
			if uploaded != nil {
				uploaded.Add(1)
			}
			return nil
		})
		return gctx.Err()
	})
	if werr := g.Wait(); err == nil {
		err = werr
	}
	return total.Load(), err
}
