#!/usr/bin/env bash
# Prints the path of a MinIO server binary for the S3 tests, building it
# once (about 2 minutes, one static ~150 MB binary) into a cache outside the
# repository. The MinIO server and Stallfree's "minio" cache policy share a
# name and nothing else.
set -euo pipefail
version=${MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}
dir=${XDG_CACHE_HOME:-$HOME/.cache}/stallfree/minio-$version
if [ ! -x "$dir/minio" ]; then
	{
		echo "== building the MinIO server $version (S3 tests and --profile s3 need a real S3 server)"
		echo "   into $dir, once: later runs reuse it"
		echo "   about 2-6 minutes on 2 cores (go install of github.com/minio/minio; the output below is go's)"
	} >&2
	mkdir -p "$dir"
	CGO_ENABLED=0 GOBIN="$dir" GOFLAGS=-mod=mod go install "github.com/minio/minio@$version" >&2
fi
echo "$dir/minio"
