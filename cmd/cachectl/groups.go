package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"

	"stallfree/api"
)

// groups: cachectl groups ls|show NAME|rm NAME (coordinated prep).
func (a *app) groups(ctx context.Context, args []string) error {
	switch {
	case len(args) == 1 && args[0] == "ls":
		var defs []api.GroupInfo
		if err := a.c.JSON(ctx, http.MethodGet, "/v1/groups", nil, &defs); err != nil {
			return err
		}
		// The list holds definitions; each group's owner knows its jobs.
		infos := make([]api.GroupInfo, 0, len(defs))
		for _, d := range defs {
			in, err := a.group(ctx, d.Name)
			if err != nil {
				in = d
			}
			infos = append(infos, in)
		}
		if a.json {
			return a.printJSON(infos)
		}
		a.table("NAME\tDATASET\tSEED\tBATCH\tWINDOW\tJOBS\tATTACHED\tDETACHED\tSTAGED\tOWNER", func(w io.Writer) {
			for _, g := range infos {
				att, det := 0, 0
				for _, j := range g.Jobs {
					switch {
					case j.Detached:
						det++
					case j.Seen:
						att++
					}
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d (%d B)\t%s\n", esc(g.Name), esc(g.Dataset), g.Seed, g.BatchSize, g.Window,
					len(g.Jobs), att, det, g.StagedBatches, g.StagedBytes, esc(g.Owner))
			}
		})
		return nil
	case len(args) == 2 && args[0] == "show":
		g, err := a.group(ctx, args[1])
		if err != nil {
			return err
		}
		if a.json {
			return a.printJSON(g)
		}
		fmt.Fprintf(a.out, "group %s: dataset %s, seed %d, batch %d, window %d, %d batches of %d samples an epoch; owner %s holds %d batches (%d B)\n",
			esc(g.Name), esc(g.Dataset), g.Seed, g.BatchSize, g.Window, g.Batches, g.Samples, esc(g.Owner), g.StagedBatches, g.StagedBytes)
		a.table("JOB\tEPOCH\tBATCH\tSTATE\tPREPARED\tSERVED\tWHY", func(w io.Writer) {
			for _, j := range g.Jobs {
				state := "attached"
				switch {
				case j.Detached:
					state = "detached"
				case !j.Seen:
					state = "not seen"
				}
				fmt.Fprintf(w, "%d\t%d\t%d\t%s\t%d\t%d\t%s\n", j.Job, j.Epoch, j.Batch, state, j.Prepared, j.Served, esc(j.Why))
			}
		})
		return nil
	case len(args) == 2 && args[0] == "rm":
		return a.c.JSON(ctx, http.MethodDelete, "/v1/groups/"+url.PathEscape(args[1]), nil, nil)
	}
	return usageError{"groups ls | groups show NAME | groups rm NAME"}
}

func (a *app) group(ctx context.Context, name string) (api.GroupInfo, error) {
	var g api.GroupInfo
	err := a.c.JSON(ctx, http.MethodGet, "/v1/groups/"+url.PathEscape(name), nil, &g)
	return g, err
}
