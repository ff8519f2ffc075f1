// Command sfbench runs `make bench`: Stallfree against nginx, memcached and
// the hardware on the same data, alternating targets in one run.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/dustin/go-humanize"

	"stallfree/bench"
)

func main() {
	items := flag.Int("items", 2000, "benchmark items")
	size := flag.String("size", "110KiB", "bytes per item")
	rounds := flag.Int("rounds", 5, "alternating rounds per target")
	dur := flag.Duration("duration", 3*time.Second, "length of one run")
	conc := flag.Int("c", 16, "connections in the main comparison")
	work := flag.String("work", filepath.Join(os.TempDir(), "stallfree-bench"), "scratch directory")
	binDir := flag.String("bin", "bin", "directory with cachenode")
	out := flag.String("out", "docs/bench", "where results.json and the plots go")
	doc := flag.String("doc", "BENCHMARKS.md", "report to write")
	memGiB := flag.Float64("mem-gib", 4, "cached GiB for the memory figures")
	serveRaw := flag.String("serve-raw", "", "internal: serve the raw TCP ceiling on this address")
	only := flag.String("only", "", "comma-separated targets to run alone (for profiling; writes no report)")
	profile := flag.Bool("pprof", false, "serve pprof on every benchmark node (addresses in the log)")
	minioBin := flag.String("minio", "", "MinIO server binary for the S3 figures (scripts/minio.sh prints it; empty: no S3 figures)")
	s3Objects := flag.Int("s3-objects", 4000, "objects of -size read from MinIO in the S3 figures")
	s3List := flag.Int("s3-list", 100000, "small objects registered as one S3 dataset")
	listKeys := flag.Int("list-keys", 1000000, "keys of the manifest-sized fake bucket whose registration is timed (0: skipped)")
	listOnly := flag.Bool("list-only", false, "measure only the registration of -list-keys keys, as JSON; writes no report")
	manifestItems := flag.Int("manifest-items", 10000000, "files of the directory dataset whose registration and per-item memory are measured (0: skipped)")
	manifestOnly := flag.Bool("manifest-only", false, "measure only the registration of -manifest-items files, as JSON; writes no report")
	s3Only := flag.Bool("s3-only", false, "measure only the S3 figures (needs -minio) and print them as JSON; writes no report")
	tarSamples := flag.Int("tar-samples", 6000, "WebDataset samples (.jpg of -size/8, .cls, .json) in the tar-shard figures")
	routingOnly := flag.Bool("routing-only", false, "measure only owner routing (2 and 4 nodes) and batch64/single by item size, as JSON; writes no report")
	tarOnly := flag.Bool("tar-only", false, "measure only the tar-shard figures and print them as JSON; writes no report")
	report := flag.Bool("report", false, "measure nothing: rewrite the report and plots from OUT/results.json (after editing the notes)")
	flag.Parse()
	if *report {
		rep, err := bench.ReadReport(filepath.Join(*out, "results.json"))
		if err == nil {
			err = bench.WriteReport(rep, *out, *doc)
		}
		if err != nil {
			fail(err)
		}
		return
	}
	sz, err := humanize.ParseBytes(*size)
	if err != nil {
		fail(err)
	}
	if *serveRaw != "" {
		ln, err := net.Listen("tcp", *serveRaw)
		if err != nil {
			fail(err)
		}
		fail(bench.ServeRaw(ln, int(sz)))
	}
	self, _ := os.Executable()
	bin, _ := filepath.Abs(*binDir)
	os.MkdirAll(*work, 0o755)
	os.MkdirAll(*out, 0o755)
	cfg := bench.Config{Items: *items, Size: int(sz), Rounds: *rounds, Duration: *dur, Conc: *conc,
		Work: *work, Bin: bin, Self: self, Out: *out, Doc: *doc, MemGiB: *memGiB, Profile: *profile, Log: os.Stderr,
		MinIO: *minioBin, S3Objects: *s3Objects, S3List: *s3List, TarSamples: *tarSamples, ListKeys: *listKeys,
		ManifestItems: *manifestItems}
	if *only != "" {
		cfg.Only = strings.Split(*only, ",")
	}
	// One section alone, printed as JSON (no report).
	switch {
	case *s3Only:
		printJSON(bench.S3(&cfg, cfg.MinIO, cfg.S3Objects, cfg.Size, cfg.S3List))
		return
	case *listOnly:
		printJSON(bench.S3List(&cfg, cfg.ListKeys))
		return
	case *manifestOnly:
		printJSON(bench.Manifest(&cfg, cfg.ManifestItems))
		return
	case *tarOnly:
		printJSON(bench.Tar(&cfg, cfg.TarSamples, cfg.Size/8, 500, cfg.Duration))
		return
	case *routingOnly:
		dataDir := filepath.Join(cfg.Work, "data")
		if _, err := bench.WriteFixed(dataDir, cfg.Items, cfg.Size); err != nil {
			fail(err)
		}
		rep := &bench.Report{}
		err := bench.RoutingAndBatches(&cfg, rep, dataDir)
		printJSON(map[string]any{"routing": rep.Routing, "batch_sizes": rep.BatchSizes}, err)
		return
	}
	rep, err := bench.Main(cfg)
	if err != nil {
		fail(err)
	}
	if *only != "" {
		return
	}
	rep.Commands = os.Args
	b, _ := json.MarshalIndent(rep, "", "  ")
	if err := os.WriteFile(filepath.Join(*out, "results.json"), b, 0o644); err != nil {
		fail(err)
	}
	if err := bench.WriteReport(rep, *out, *doc); err != nil {
		fail(err)
	}
	fmt.Printf("wrote %s and %s (%.0fs)\n", *doc, *out, rep.DurationS)
}

// printJSON prints a section's result, or fails with its error.
func printJSON[T any](v T, err error) {
	if err != nil {
		fail(err)
	}
	b, _ := json.MarshalIndent(v, "", "  ")
	fmt.Println(string(b))
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "sfbench:", err)
	os.Exit(1)
}
