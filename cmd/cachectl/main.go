// Command cachectl manages a Stallfree cluster through any node's HTTP API.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"

	"stallfree/client"
)

const usage = `usage: cachectl [--node URL] [--token-file F] [--json] <command>

commands:
  members                      the cluster's members and their state
  health                       exit 0 when the node answers /readyz: joined, caught up, its --dataset flags
                               registered (for container health checks; /healthz only says the process serves)
  datasets add NAME SOURCE     register a dataset (a path, dir:///abs/path or s3://BUCKET/PREFIX)
  datasets ls                  list datasets
  datasets refresh NAME        list a dataset's source again as a new version (after its files changed)
  datasets rm NAME             remove a dataset
  datasets quota NAME SIZE     cap the bytes of a dataset the cluster caches (e.g. 2GiB; none lifts it)
  warmup NAME                  load a dataset into the cluster's memory, with progress
  stats                        per-node cache statistics, cluster-wide
  jobs add|ls|rm|resize        training jobs (see cachectl jobs add -h; resize JOB --world-size N --ranks ...)
  sample JOB --epoch E --rank R   a rank's locality-aware order
  groups ls|show NAME|rm NAME  coordinated-prep groups: definitions, each job's position and state
  epoch NAME [--epochs N --workers W --verify DIR]
                               read a dataset in random order like a loader; report throughput and hit mix
  bench JOB [--epochs N --workers W --gpu-time 20ms]
                               simulate the job's loaders: throughput, hit mix, remote fraction, stall per epoch
  analyze DATASET [--gpu-rate ITEMS/S --svg FILE]
                               DS-Analyzer: ingestion rates (memory, cluster, cold), fetch stall, what-if by cache size
                               (a table and a chart; --svg writes the chart as a picture)
  top                          live screen: members, datasets, jobs' wait share per rank (stragglers), checkpoints;
                               refreshed every second, q quits; off a terminal one snapshot as text
  plan [apply]                 the memory split by sensitivity: per job, measured vs predicted epoch
                               time, knee, split; apply sets the quotas
  gendata DIR [--items N --size 110KiB --format files|jpeg|tar --shard-samples N]
                               write a synthetic dataset (for demos and benchmarks): files: noise in
                               class folders; jpeg: real JPEGs in class folders; tar: WebDataset
                               shards of .jpg (real JPEGs)/.cls/.json samples
  checkpoints ls [NAME] | rm NAME
                               checkpoints in peer memory: committed steps, copies, persisted
  s3-upload DIR s3://BUCKET[/PREFIX] [--s3-endpoint URL --s3-credentials-file F --wait 60s]
                               copy a directory into S3 (making the bucket), e.g. the demo data into MinIO
`

type app struct {
	c    *client.Client
	json bool
	out  io.Writer
	tty  bool // progress as a bar (on a terminal) or as plain lines
}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // the flag package has printed the usage
		}
		// An error may carry a node's message: escaped like any string from it.
		fmt.Fprintln(os.Stderr, "cachectl:", esc(err.Error()))
		var ue usageError
		if errors.As(err, &ue) {
			fmt.Fprint(os.Stderr, usage)
			os.Exit(2)
		}
		os.Exit(1)
	}
}

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

func run(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("cachectl", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(os.Stderr, usage); fs.PrintDefaults() }
	nodeURL := fs.String("node", envOr("STALLFREE_NODE", "http://127.0.0.1:7070"), "node URL (env STALLFREE_NODE)")
	tokenFile := fs.String("token-file", os.Getenv("STALLFREE_TOKEN_FILE"), "file with the bearer token (env STALLFREE_TOKEN_FILE)")
	asJSON := fs.Bool("json", false, "print JSON instead of tables")
	if err := fs.Parse(args); err != nil {
		return err
	}
	token := ""
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
		token = strings.TrimSpace(string(b))
	}
	a := &app{c: client.New(*nodeURL, token), json: *asJSON, out: safeWriter{out}, tty: out == io.Writer(os.Stdout) && interactive()}
	rest := fs.Args()
	if len(rest) == 0 {
		return usageError{"no command"}
	}
	switch rest[0] {
	case "members":
		return a.members(ctx)
	case "health":
		return a.health(ctx)
	case "datasets":
		return a.datasets(ctx, rest[1:])
	case "warmup":
		if len(rest) != 2 {
			return usageError{"warmup NAME"}
		}
		return a.warmup(ctx, rest[1])
	case "stats":
		return a.stats(ctx)
	case "jobs":
		return a.jobs(ctx, rest[1:])
	case "sample":
		return a.sample(ctx, rest[1:])
	case "groups":
		return a.groups(ctx, rest[1:])
	case "epoch":
		return a.epoch(ctx, rest[1:])
	case "gendata":
		return a.gendata(rest[1:])
	case "s3-upload":
		return a.upload(ctx, rest[1:])
	case "checkpoints":
		return a.checkpoints(ctx, rest[1:])
	case "bench":
		return a.bench(ctx, rest[1:])
	case "top":
		return a.top(ctx, rest[1:])
	case "analyze":
		return a.analyze(ctx, rest[1:])
	case "plan":
		return a.plan(ctx, rest[1:])
	}
	return usageError{fmt.Sprintf("unknown command %q", rest[0])}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func (a *app) printJSON(v any) error {
	enc := json.NewEncoder(a.out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func (a *app) table(header string, rows func(w io.Writer)) {
	w := tabwriter.NewWriter(a.out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, header)
	rows(w)
	w.Flush()
}

func (a *app) members(ctx context.Context) error {
	cl, err := a.c.Cluster(ctx)
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(cl)
	}
	a.table("NAME\tSTATE\tHTTP\tPEER\tSHARE\tITEMS\tBYTES\tCAPACITY\tRAFT\tROLE", func(w io.Writer) {
		for _, m := range cl.Members {
			role := ""
			if m.Name == cl.Leader {
				role = "leader"
			}
			if m.Name == cl.Self {
				role = strings.TrimPrefix(role+",self", ",")
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%.1f%%\t%d\t%s\t%s\t%s\t%s\n", esc(m.Name), esc(m.State), esc(m.HTTP), esc(m.Peer), 100*m.Share,
				m.Items, humanize.IBytes(m.Bytes), humanize.IBytes(m.Capacity), esc(m.Raft), role)
		}
	})
	return nil
}

func (a *app) health(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	// Ready, not just up: joined, caught up, its --dataset flags registered.
	return a.c.JSON(ctx, "GET", "/readyz", nil, nil)
}

func (a *app) datasets(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usageError{"datasets add|ls|rm"}
	}
	switch {
	case args[0] == "add" && len(args) == 3:
		d, err := a.register(ctx, args[1], args[2])
		if err != nil {
			return err
		}
		if a.json {
			return a.printJSON(d)
		}
		count := fmt.Sprintf("%d items", d.Items)
		if d.Samples > 0 { // a tar dataset: its items are the samples' members
			count = fmt.Sprintf("%d samples (%d members)", d.Samples, d.Items)
		}
		fmt.Fprintf(a.out, "dataset %s: %s, %s from %s (version %d)\n", esc(d.Name), count, humanize.IBytes(uint64(d.Bytes)), esc(d.Source), d.Version)
		return nil
	case args[0] == "ls" && len(args) == 1:
		ds, err := a.c.Datasets(ctx)
		if err != nil {
			return err
		}
		if a.json {
			return a.printJSON(ds)
		}
		a.table("NAME\tITEMS\tBYTES\tQUOTA\tVERSION\tSOURCE", func(w io.Writer) {
			for _, d := range ds {
				quota := "-" // none: the dataset may fill the memory MinIO gives it
				if d.Quota != nil {
					quota = humanize.IBytes(*d.Quota)
				}
				fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%d\t%s\n", esc(d.Name), d.Items, humanize.IBytes(uint64(d.Bytes)), quota, d.Version, datasetOrigin(d))
			}
		})
		return nil
	case args[0] == "refresh" && len(args) == 2:
		return a.refresh(ctx, args[1])
	case args[0] == "rm" && len(args) == 2:
		return a.c.DeleteDataset(ctx, args[1])
	case args[0] == "quota" && len(args) == 3:
		return a.quota(ctx, args[1], args[2])
	}
	return usageError{"datasets add NAME SOURCE | ls | refresh NAME | rm NAME | quota NAME SIZE|none"}
}

// refresh lists a dataset's source again as a new version (items whose
// files changed answer 409 "source changed" until then).
func (a *app) refresh(ctx context.Context, name string) error {
	changed := false
	d, err := a.listing(ctx, name, func() (client.Dataset, error) {
		d, c, err := a.c.RefreshDataset(ctx, name)
		changed = c
		return d, err
	})
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(d)
	}
	if !changed {
		fmt.Fprintf(a.out, "dataset %s: unchanged, still version %d (%d items, %s)\n", esc(d.Name), d.Version, d.Items, humanize.IBytes(uint64(d.Bytes)))
		return nil
	}
	fmt.Fprintf(a.out, "dataset %s: refreshed as version %d: %d items, %s from %s\n", esc(d.Name), d.Version, d.Items,
		humanize.IBytes(uint64(d.Bytes)), esc(d.Source))
	return nil
}

// register registers a dataset and, while the leader lists (or, for tar
// shards, indexes) its source, shows how far it has got.
func (a *app) register(ctx context.Context, name, src string) (client.Dataset, error) {
	return a.listing(ctx, name, func() (client.Dataset, error) { return a.c.PutDataset(ctx, name, src) })
}

// listing runs put, a request that has the leader list name's source, and
// shows how far the listing has got meanwhile.
func (a *app) listing(ctx context.Context, name string, put func() (client.Dataset, error)) (client.Dataset, error) {
	type result struct {
		d   client.Dataset
		err error
	}
	done := make(chan result, 1)
	go func() {
		d, err := put()
		done <- result{d, err}
	}()
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	var bar *progress
	start := time.Now()
	for {
		select {
		case r := <-done:
			if bar != nil {
				bar.Finish()
				if r.err == nil { // the last line: count, bytes, time
					fmt.Fprintf(os.Stderr, "registered %s: %d items, %s in %.1fs\n", esc(name), r.d.Items,
						humanize.IBytes(uint64(r.d.Bytes)), time.Since(start).Seconds())
				}
			}
			return r.d, r.err
		case <-tick.C:
		}
		if a.json {
			continue
		}
		p, err := a.c.Registration(ctx, name)
		if err != nil || !p.Running {
			continue // not started yet, or a registration from before
		}
		switch {
		case p.Shards > 0:
			if bar == nil || bar.total != p.Shards {
				bar = newProgress(os.Stderr, a.tty, "indexing "+name, "shards", p.Shards)
			}
			bar.Update(p.ShardsDone, p.ShardBytes, fmt.Sprintf("%d members", p.Listed))
		default:
			if bar == nil {
				bar = newProgress(os.Stderr, a.tty, "listing "+name, "objects", -1)
			}
			bar.Update(p.Listed, -1, "")
		}
	}
}

// memberClients returns a client per alive member, or just the given node
// when the cluster answer names no HTTP addresses.
func (a *app) memberClients(ctx context.Context) ([]*client.Client, []string, error) {
	cl, err := a.c.Cluster(ctx)
	if err != nil {
		return nil, nil, err
	}
	var cs []*client.Client
	var names []string
	for _, m := range cl.Members {
		if m.State != "alive" || m.HTTP == "" {
			continue
		}
		c := client.New(m.HTTP, a.c.Token)
		if m.Name == cl.Self {
			c = a.c
		}
		cs = append(cs, c)
		names = append(names, m.Name)
	}
	if len(cs) == 0 {
		return []*client.Client{a.c}, []string{cl.Self}, nil
	}
	return cs, names, nil
}

// warmup starts a warm-up on every member (each loads the items it owns) and
// shows their combined progress until all are done.
func (a *app) warmup(ctx context.Context, name string) error {
	cs, names, err := a.memberClients(ctx)
	if err != nil {
		return err
	}
	for _, c := range cs {
		if _, err := c.StartWarmup(ctx, name); err != nil {
			return err
		}
	}
	var bar *progress
	start := time.Now()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		var sum client.Progress
		running, full := false, false
		for i, c := range cs {
			p, err := c.Warmup(ctx, name)
			if err != nil {
				return fmt.Errorf("%s: %w", esc(names[i]), err)
			}
			if p.Error != "" {
				if strings.Contains(p.Error, "source changed: ") {
					return fmt.Errorf("warm-up on %s: %s; `cachectl datasets refresh %s` lists the source again as a new version",
						esc(names[i]), esc(p.Error), esc(name))
				}
				return fmt.Errorf("warm-up on %s: %s", esc(names[i]), esc(p.Error))
			}
			sum.Done += p.Done
			sum.Total += p.Total
			sum.Bytes += p.Bytes
			running = running || p.Running
			full = full || p.Full
		}
		if bar == nil && !a.json {
			bar = newProgress(os.Stderr, a.tty, "warm-up "+name, "items", sum.Total)
		}
		if bar != nil {
			bar.Update(sum.Done, sum.Bytes, "")
		}
		if !running {
			el := time.Since(start)
			if a.json {
				return a.printJSON(map[string]any{"done": sum.Done, "total": sum.Total, "bytes": sum.Bytes, "full": full, "seconds": el.Seconds()})
			}
			if bar != nil {
				bar.Finish()
			}
			fmt.Fprintf(a.out, "warmed %d of %d items (%s) in %.1fs, %s/s\n", sum.Done, sum.Total,
				humanize.IBytes(uint64(sum.Bytes)), el.Seconds(), humanize.IBytes(uint64(float64(sum.Bytes)/max(el.Seconds(), 1e-3))))
			if full {
				fmt.Fprintln(a.out, "the cache is full: the rest is served from storage (MinIO keeps what it holds)")
			}
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

func (a *app) stats(ctx context.Context) error {
	cs, names, err := a.memberClients(ctx)
	if err != nil {
		return err
	}
	var all []client.Stats
	var tot client.Stats
	for i, c := range cs {
		s, err := c.Stats(ctx)
		if err != nil {
			return fmt.Errorf("%s: %w", esc(names[i]), err)
		}
		all = append(all, s)
		tot.ItemsCached += s.ItemsCached
		tot.BytesCached += s.BytesCached
		tot.CapacityBytes += s.CapacityBytes
		tot.HitsLocal += s.HitsLocal
		tot.HitsPeer += s.HitsPeer
		tot.Misses += s.Misses
		tot.SourceReads += s.SourceReads
		tot.SourceBytes += s.SourceBytes
		tot.PeerBytesIn += s.PeerBytesIn
		tot.PeerBytesOut += s.PeerBytesOut
		tot.LoaderWaitSeconds += s.LoaderWaitSeconds
		tot.LoaderBatches += s.LoaderBatches
	}
	if a.json {
		return a.printJSON(all)
	}
	tot.Name = "TOTAL"
	a.table("NODE\tPOLICY\tITEMS\tCACHED\tCAPACITY\tHITS\tPEER\tMISSES\tHIT%\tSRC READS\tSRC BYTES\tPEER IN\tPEER OUT\tLOADER WAIT", func(w io.Writer) {
		for _, s := range append(all, tot) {
			req := s.HitsLocal + s.HitsPeer + s.Misses
			pct := 0.0
			if req > 0 {
				pct = 100 * float64(s.HitsLocal+s.HitsPeer) / float64(req)
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%d\t%d\t%d\t%.1f\t%d\t%s\t%s\t%s\t%.2fs/%d batches\n", esc(s.Name), esc(s.Policy), s.ItemsCached,
				humanize.IBytes(s.BytesCached), humanize.IBytes(s.CapacityBytes), s.HitsLocal, s.HitsPeer, s.Misses, pct,
				s.SourceReads, humanize.IBytes(s.SourceBytes), humanize.IBytes(s.PeerBytesIn), humanize.IBytes(s.PeerBytesOut),
				s.LoaderWaitSeconds, s.LoaderBatches)
		}
	})
	a.datasetUsage(all)
	return nil
}
