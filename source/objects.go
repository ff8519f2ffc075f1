package source

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/minio/minio-go/v7"
)

// OpenS3Objects opens s3://BUCKET/PREFIX for writing and reading whole
// objects under the prefix (checkpoint persistence), with the same client,
// endpoint and credentials as S3 datasets.
func OpenS3Objects(spec string, cfg S3Config) (*S3, error) {
	norm, err := Normalize(spec)
	if err != nil {
		return nil, err
	}
	if !strings.HasPrefix(norm, "s3://") {
		return nil, fmt.Errorf("source %q: want s3://BUCKET/PREFIX", spec)
	}
	return openS3(norm, Options{S3: cfg})
}

// PutObject writes size bytes from r as the object PREFIX/key.
func (s *S3) PutObject(ctx context.Context, key string, r io.Reader, size int64) error {
	if _, err := s.core.Client.PutObject(ctx, s.bucket, s.prefix+key, r, size, minio.PutObjectOptions{}); err != nil {
		return s.storageErr("write", s.prefix+key, err)
	}
	return nil
}

// GetObject streams the object PREFIX/key and returns its size.
func (s *S3) GetObject(ctx context.Context, key string) (io.ReadCloser, int64, error) {
	body, info, _, err := s.core.GetObject(ctx, s.bucket, s.prefix+key, minio.GetObjectOptions{})
	if err != nil {
		return nil, 0, s.storageErr("read", s.prefix+key, err)
	}
	return body, info.Size, nil
}

// RemoveObject deletes the object PREFIX/key.
func (s *S3) RemoveObject(ctx context.Context, key string) error {
	if err := s.core.Client.RemoveObject(ctx, s.bucket, s.prefix+key, minio.RemoveObjectOptions{}); err != nil {
		return s.storageErr("remove", s.prefix+key, err)
	}
	return nil
}
