package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sync/atomic"
	"time"

	"github.com/dustin/go-humanize"

	"stallfree/source"
)

// upload copies a directory into an S3 bucket: how the compose file's MinIO
// gets its demo data, and a quick way to try s3:// sources.
func (a *app) upload(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("s3-upload", flag.ContinueOnError)
	endpoint := fs.String("s3-endpoint", os.Getenv("STALLFREE_S3_ENDPOINT"), "S3-compatible endpoint (env STALLFREE_S3_ENDPOINT; empty: AWS)")
	region := fs.String("s3-region", envOr("STALLFREE_S3_REGION", "us-east-1"), "S3 region")
	creds := fs.String("s3-credentials-file", os.Getenv("STALLFREE_S3_CREDENTIALS_FILE"), "shared AWS credentials file (else AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)")
	profile := fs.String("s3-profile", "default", "profile in --s3-credentials-file")
	wait := fs.Duration("wait", 0, "retry for this long while the endpoint does not answer (a server still starting)")
	pos, err := parseCommand(fs, args, 2, "s3-upload DIR s3://BUCKET[/PREFIX]")
	if err != nil {
		return err
	}
	cfg := source.S3Config{Endpoint: *endpoint, Region: *region, CredentialsFile: *creds, Profile: *profile, Env: os.Getenv}
	start := time.Now()
	deadline := start.Add(*wait)
	for {
		var n atomic.Int64
		bytes, err := source.Upload(ctx, pos[0], pos[1], cfg, &n)
		if err == nil {
			el := time.Since(start)
			fmt.Fprintf(a.out, "uploaded %d objects (%s) to %s in %.1fs\n", n.Load(), humanize.IBytes(uint64(bytes)), pos[1], el.Seconds())
			return nil
		}
		if !errors.Is(err, source.ErrUnavailable) || time.Now().After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
