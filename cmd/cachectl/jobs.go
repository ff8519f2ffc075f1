package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"

	"stallfree/api"
)

func (a *app) jobs(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usageError{"jobs add|ls|rm|resize"}
	}
	switch args[0] {
	case "add":
		fs := flag.NewFlagSet("jobs add", flag.ContinueOnError)
		ds := fs.String("dataset", "", "dataset name")
		seed := fs.Uint64("seed", 0, "shuffle seed")
		world := fs.Int("world-size", 1, "number of ranks")
		batch := fs.Int("batch-size", 256, "per-rank batch size")
		ranks := fs.String("ranks", "", "comma-separated node name of each rank")
		pos, err := parseCommand(fs, args[1:], 1, "jobs add NAME --dataset D [--seed S --world-size W --batch-size B --ranks n1,n2]")
		if err != nil {
			return err
		}
		j := api.Job{Name: pos[0], Dataset: *ds, Seed: *seed, WorldSize: *world, BatchSize: *batch}
		if *ranks != "" {
			j.Ranks = strings.Split(*ranks, ",")
		}
		got, err := a.c.PutJob(ctx, j)
		if err != nil {
			return err
		}
		if a.json {
			return a.printJSON(got)
		}
		fmt.Fprintf(a.out, "job %s: dataset %s, seed %d, %s of batch %d\n", esc(got.Name), esc(got.Dataset), got.Seed, plural(got.WorldSize, "rank"), got.BatchSize)
		return nil
	case "resize":
		fs := flag.NewFlagSet("jobs resize", flag.ContinueOnError)
		world := fs.Int("world-size", 0, "the new number of ranks (0: unchanged)")
		ranks := fs.String("ranks", "", "comma-separated node name of each new rank (empty: none)")
		pos, err := parseCommand(fs, args[1:], 1, "jobs resize NAME --world-size N [--ranks n1,n2,...]")
		if err != nil {
			return err
		}
		j, err := a.c.Job(ctx, pos[0])
		if err != nil {
			return err
		}
		from := j.Version
		if *world > 0 {
			j.WorldSize = *world
		}
		j.Ranks = nil
		if *ranks != "" {
			j.Ranks = strings.Split(*ranks, ",")
		}
		j.Version, j.Previous = 0, nil
		got, err := a.c.PutJob(ctx, j)
		if err != nil {
			return err
		}
		if a.json {
			return a.printJSON(got)
		}
		if got.Previous == nil || got.Previous.Generation != from {
			fmt.Fprintf(a.out, "job %s unchanged (generation %d)\n", esc(got.Name), got.Version)
			return nil
		}
		fmt.Fprintf(a.out, "job %s: generation %d, %d ranks (was generation %d, %d ranks); samplers saved under %d resume under it\n",
			esc(got.Name), got.Version, got.WorldSize, from, got.Previous.WorldSize, from)
		return nil
	case "ls":
		js, err := a.c.Jobs(ctx)
		if err != nil {
			return err
		}
		if a.json {
			return a.printJSON(js)
		}
		positions := a.positions(ctx, js)
		// GENERATION is the job's version, which a sampler's saved state
		// names; POSITIONS are the ranks' last reported checkpoints.
		a.table("NAME\tDATASET\tSEED\tWORLD\tBATCH\tGENERATION\tRANKS\tPOSITIONS", func(w io.Writer) {
			for _, j := range js {
				fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%s\n", esc(j.Name), esc(j.Dataset), j.Seed, j.WorldSize, j.BatchSize, j.Version,
					esc(strings.Join(j.Ranks, ",")), esc(positions[j.Name]))
			}
		})
		return nil
	case "rm":
		if len(args) != 2 {
			return usageError{"jobs rm NAME"}
		}
		return a.c.DeleteJob(ctx, args[1])
	}
	return usageError{"jobs add|ls|rm|resize"}
}

func (a *app) sample(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sample", flag.ContinueOnError)
	epoch := fs.Int("epoch", 0, "epoch")
	rank := fs.Int("rank", 0, "rank")
	pos, err := parseCommand(fs, args, 1, "sample JOB --epoch E --rank R")
	if err != nil {
		return err
	}
	out, err := a.c.RankOrder(ctx, pos[0], *epoch, *rank)
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(struct {
			Indices []int `json:"indices"`
		}{out.Indices})
	}
	for _, i := range out.Indices {
		fmt.Fprintln(a.out, i)
	}
	return nil
}

// positions renders, per job, the rank positions every member was told of
// ("r0 e1@48 r1 e1@48"; the latest report of each rank; "-" for none).
func (a *app) positions(ctx context.Context, js []api.Job) map[string]string {
	cs, _, err := a.memberClients(ctx)
	out := map[string]string{}
	for _, j := range js {
		out[j.Name] = "-"
		if err != nil {
			continue
		}
		latest := map[int]api.RankPosition{}
		for _, c := range cs {
			ps, err := c.RankPositions(ctx, j.Name)
			if err != nil {
				continue
			}
			for _, p := range ps {
				if q, ok := latest[p.Rank]; !ok || p.SecondsAgo < q.SecondsAgo {
					latest[p.Rank] = p
				}
			}
		}
		var parts []string
		for _, r := range slices.Sorted(maps.Keys(latest)) {
			p := latest[r]
			g := ""
			if p.Generation != j.Version {
				g = fmt.Sprintf(" (gen %d)", p.Generation)
			}
			parts = append(parts, fmt.Sprintf("r%d e%d@%d%s", r, p.Epoch, p.Position, g))
		}
		if len(parts) > 0 {
			out[j.Name] = strings.Join(parts, " ")
		}
	}
	return out
}

// plural is "1 rank", "3 ranks".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}
