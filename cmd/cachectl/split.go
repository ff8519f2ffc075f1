package main

import (
	"context"
	"fmt"
	"io"
	"math"

	"github.com/dustin/go-humanize"

	"stallfree/api"
)

// quota is `cachectl datasets quota NAME SIZE|none`.
func (a *app) quota(ctx context.Context, name, size string) error {
	if size == "none" {
		d, err := a.c.LiftQuota(ctx, name)
		if err != nil {
			return err
		}
		if a.json {
			return a.printJSON(d)
		}
		fmt.Fprintf(a.out, "dataset %s: no quota\n", esc(d.Name))
		return nil
	}
	n, err := humanize.ParseBytes(size)
	if err != nil || n > math.MaxInt64 {
		return usageError{fmt.Sprintf("datasets quota %s %q: want a size in bytes, such as 512MiB or 4GiB", name, size)}
	}
	d, err := a.c.SetQuota(ctx, name, int64(n))
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(d)
	}
	fmt.Fprintf(a.out, "dataset %s: quota %s of %s\n", esc(d.Name), humanize.IBytes(n), humanize.IBytes(uint64(d.Bytes)))
	return nil
}

// plan is `cachectl plan [apply]`: the split by sensitivity, with each
// job's measured epoch beside the epoch predicted under the split.
func (a *app) plan(ctx context.Context, args []string) error {
	var (
		p   api.Plan
		err error
	)
	switch {
	case len(args) == 0:
		p, err = a.c.Plan(ctx)
	case len(args) == 1 && args[0] == "apply":
		p, err = a.c.ApplyPlan(ctx)
	default:
		return usageError{"plan [apply]"}
	}
	if err != nil {
		return err
	}
	if a.json {
		return a.printJSON(p)
	}
	a.table("JOB\tDATASET\tEPOCH MEASURED\tEPOCH NOW (MODEL)\tEPOCH PLANNED\tCACHED\tKNEE\tSPLIT\tSAVED/GiB", func(w io.Writer) {
		for _, j := range p.Jobs {
			fmt.Fprintf(w, "%s\t%s\t%.2fs\t%.2fs\t%.2fs\t%s\t%s\t%s\t%.1fs\n", esc(j.Job), esc(j.Dataset), j.EpochS, j.EpochSNow, j.EpochSPredicted,
				humanize.IBytes(j.CachedBytes), humanize.IBytes(j.KneeBytes), humanize.IBytes(p.Split[j.Dataset]), j.SecondsSavedPerGiB)
		}
	})
	verb := "predicted saving"
	if p.Applied {
		verb = "applied; predicted saving"
	}
	fmt.Fprintf(a.out, "memory %s; %s %.1f%% of the jobs' epoch time\n", humanize.IBytes(p.MemoryBytes), verb, 100*p.PredictedSaving)
	return nil
}
