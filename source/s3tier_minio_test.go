//go:build minio

package source

import (
	"context"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"stallfree/miniotest"
)

// withMinIO: the integration tier runs every S3 test against a real MinIO
// server too (make test does; STALLFREE_MINIO names the binary).
const withMinIO = true

type minioBackend struct {
	*miniotest.TestServer
	t *testing.T
}

func startMinIO(t *testing.T) s3Backend { return minioBackend{miniotest.Start(t), t} }

func (m minioBackend) url() string           { return m.Endpoint }
func (m minioBackend) checksSecrets() bool   { return true }
func (m minioBackend) outage() time.Duration { return 2 * time.Second }

func (m minioBackend) Remove(bucket, key string) {
	if err := m.Client.RemoveObject(context.Background(), bucket, key, minio.RemoveObjectOptions{}); err != nil {
		m.t.Fatal(err)
	}
}
