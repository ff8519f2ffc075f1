package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/dustin/go-humanize"

	"stallfree/client"
	"stallfree/stall"
)

// bench simulates a registered job's loaders against the cluster.
func (a *app) bench(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	epochs := fs.Int("epochs", 2, "epochs to run")
	first := fs.Int("first-epoch", 0, "first epoch number")
	workers := fs.Int("workers", 4, "batches in flight per rank")
	gpu := fs.Duration("gpu-time", 20*time.Millisecond, "time the GPU spends per batch (stands in for training)")
	route := fs.String("route", "local", "local (each rank's batches through its node) or owner (each batch split by owner, read from the owners)")
	pos, err := parseCommand(fs, args, 1, "bench JOB [--epochs N --workers W --gpu-time 20ms --route local|owner]")
	if err != nil {
		return err
	}
	if *route != "local" && *route != "owner" {
		return usageError{fmt.Sprintf("--route %q: want local or owner", *route)}
	}
	cs, names, err := a.memberClients(ctx)
	if err != nil {
		return err
	}
	nodes := map[string]*client.Client{}
	for i, c := range cs {
		nodes[names[i]] = c
	}
	reps, err := stall.RunJob(ctx, stall.SimConfig{Job: pos[0], Epochs: *epochs, FirstEpoch: *first, Workers: *workers,
		GPUPerBatch: *gpu, Nodes: nodes, Default: a.c, RouteByOwner: *route == "owner"})
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(reps)
	}
	a.table("EPOCH\tSECONDS\tITEMS/S\tMB/S\tLOCAL\tPEER\tMISS\tREMOTE\tSTALL\tSTALL%", func(w io.Writer) {
		for _, r := range reps {
			fmt.Fprintf(w, "%d\t%.2f\t%.0f\t%.0f\t%d\t%d\t%d\t%.1f%%\t%.2fs\t%.0f%%\n", r.Epoch, r.Seconds, r.ItemsPerSec, r.MBPerSec,
				r.Local, r.Peer, r.Miss, 100*r.RemoteFr, r.StallSeconds, 100*r.StallFr)
		}
	})
	return nil
}

// analyze is DS-Analyzer's differential analysis against the live cluster.
func (a *app) analyze(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("analyze", flag.ContinueOnError)
	sample := fs.Int("sample", 200, "items sampled per measurement")
	workers := fs.Int("workers", 8, "concurrent requests, as the loader's workers")
	gpuRate := fs.Float64("gpu-rate", 0, "items/s the GPU consumes (0: infinitely fast, every fetch second is stall)")
	svg := fs.String("svg", "", "also write the what-if chart to this file as an SVG picture")
	pos, err := parseCommand(fs, args, 1, "analyze DATASET [--gpu-rate ITEMS/S --sample N --workers W --svg FILE]")
	if err != nil {
		return err
	}
	cs, _, err := a.memberClients(ctx)
	if err != nil {
		return err
	}
	an, err := stall.Analyze(ctx, a.c, cs, pos[0], *sample, *workers, *gpuRate)
	if err != nil {
		return err
	}
	if *svg != "" {
		if err := writeWhatIfSVG(*svg, an.Model, an.Dataset); err != nil {
			return err
		}
	}
	if a.json {
		return a.printJSON(an)
	}
	m := an.Model
	r := m.Rates
	fmt.Fprintf(a.out, "dataset %s: %d items, %s; %d-item samples, %d workers\n", esc(an.Dataset), m.Items, humanize.IBytes(uint64(m.Bytes)), an.Sample, an.Workers)
	fmt.Fprintf(a.out, "ingestion: this node's memory %.0f items/s, cluster cache %.0f items/s, cold storage %.0f items/s (%s/s)\n",
		r.Memory, r.Cached, r.Cold, humanize.IBytes(uint64(r.Cold*r.ItemBytes)))
	gpu := "infinitely fast GPU"
	if m.GPURate > 0 {
		gpu = fmt.Sprintf("GPU at %.0f items/s (%.2fs per epoch)", m.GPURate, float64(m.Items)/m.GPURate)
	}
	cold, warm := m.Predict("minio", 0), m.Predict("minio", 1)
	fmt.Fprintf(a.out, "fetch stall per epoch with a %s: cold %.2fs of %.2fs (%.0f%%); cached %.2fs of %.2fs (%.0f%%)\n",
		gpu, cold.StallSeconds, cold.EpochSeconds, pct(cold), warm.StallSeconds, warm.EpochSeconds, pct(warm))
	fmt.Fprintln(a.out, "\nwhat if (MinIO's hit rate is the cached fraction; clairvoyant reads the same items ahead of the loader):")
	a.table("POLICY\tCACHE\tMEMORY\tEPOCH\tSTALL\tSTALL%", func(w io.Writer) {
		for _, s := range an.WhatIf {
			fmt.Fprintf(w, "%s\t%.0f%%\t%s\t%.2fs\t%.2fs\t%.0f%%\n", s.Policy, 100*s.CacheFr, humanize.IBytes(uint64(s.CacheBytes)),
				s.EpochSeconds, s.StallSeconds, pct(s))
		}
	})
	if sw, ok := a.out.(safeWriter); ok && a.tty {
		drawWhatIf(sw.w, m, true)
	} else {
		drawWhatIf(a.out, m, false)
	}
	if *svg != "" {
		fmt.Fprintf(a.out, "chart written to %s\n", *svg)
	}
	switch {
	case m.GPURate <= 0:
		fmt.Fprintln(a.out, "give --gpu-rate to see the memory that removes the stall")
	case an.MemoryNeeded < 0:
		fmt.Fprintln(a.out, "even a fully cached dataset stalls this GPU: add nodes or loader workers")
	default:
		fmt.Fprintf(a.out, "memory that removes the stall (MinIO): %s of %s (%.0f%%)\n", humanize.IBytes(uint64(an.MemoryNeeded)),
			humanize.IBytes(uint64(m.Bytes)), 100*float64(an.MemoryNeeded)/float64(max(m.Bytes, 1)))
	}
	return nil
}

func pct(s stall.Scenario) float64 {
	if s.EpochSeconds == 0 {
		return 0
	}
	return 100 * s.StallSeconds / s.EpochSeconds
}
