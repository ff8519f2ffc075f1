package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
)

type job struct {
	Name      string   `json:"name,omitempty"`
	Dataset   string   `json:"dataset"`
	Seed      uint64   `json:"seed"`
	WorldSize int      `json:"world_size"`
	BatchSize int      `json:"batch_size"`
	Ranks     []string `json:"ranks"`
	Version   uint64   `json:"version,omitempty"`
}

func (a *app) jobs(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usageError{"jobs add|ls|rm"}
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
		j := job{Dataset: *ds, Seed: *seed, WorldSize: *world, BatchSize: *batch}
		if *ranks != "" {
			j.Ranks = strings.Split(*ranks, ",")
		}
		var got job
		if err := a.c.JSON(ctx, http.MethodPut, "/v1/jobs/"+url.PathEscape(pos[0]), j, &got); err != nil {
			return err
		}
		if a.json {
			return a.printJSON(got)
		}
		fmt.Fprintf(a.out, "job %s: dataset %s, seed %d, %d ranks of batch %d\n", got.Name, got.Dataset, got.Seed, got.WorldSize, got.BatchSize)
		return nil
	case "ls":
		var js []job
		if err := a.c.JSON(ctx, http.MethodGet, "/v1/jobs", nil, &js); err != nil {
			return err
		}
		if a.json {
			return a.printJSON(js)
		}
		a.table("NAME\tDATASET\tSEED\tWORLD\tBATCH\tRANKS", func(w io.Writer) {
			for _, j := range js {
				fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%s\n", j.Name, j.Dataset, j.Seed, j.WorldSize, j.BatchSize, strings.Join(j.Ranks, ","))
			}
		})
		return nil
	case "rm":
		if len(args) != 2 {
			return usageError{"jobs rm NAME"}
		}
		return a.c.JSON(ctx, http.MethodDelete, "/v1/jobs/"+url.PathEscape(args[1]), nil, nil)
	}
	return usageError{"jobs add|ls|rm"}
}

func (a *app) sample(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("sample", flag.ContinueOnError)
	epoch := fs.Int("epoch", 0, "epoch")
	rank := fs.Int("rank", 0, "rank")
	pos, err := parseCommand(fs, args, 1, "sample JOB --epoch E --rank R")
	if err != nil {
		return err
	}
	var out struct {
		Indices []int `json:"indices"`
	}
	path := fmt.Sprintf("/v1/jobs/%s/epochs/%d/ranks/%d", url.PathEscape(pos[0]), *epoch, *rank)
	if err := a.c.JSON(ctx, http.MethodGet, path, nil, &out); err != nil {
		return err
	}
	if a.json {
		return a.printJSON(out)
	}
	for _, i := range out.Indices {
		fmt.Fprintln(a.out, i)
	}
	return nil
}
