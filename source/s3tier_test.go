//go:build !minio

package source

import "testing"

// withMinIO: this build runs the S3 tests against the in-process fake only
// (the unit tier, fast enough for mutation testing); -tags minio adds MinIO.
const withMinIO = false

func startMinIO(t *testing.T) s3Backend {
	t.Fatal("built without -tags minio")
	return nil
}
