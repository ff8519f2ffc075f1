package main

import (
	"context"
	"fmt"
	"io"

	"github.com/dustin/go-humanize"

	"stallfree/api"
)

// checkpoints: cachectl checkpoints ls [NAME] | rm NAME.
func (a *app) checkpoints(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return usageError{"checkpoints ls [NAME] | rm NAME"}
	}
	switch args[0] {
	case "ls":
		var cks []api.Checkpoint
		switch len(args) {
		case 1:
			var err error
			if cks, err = a.c.Checkpoints(ctx); err != nil {
				return err
			}
		case 2:
			ck, err := a.c.Checkpoint(ctx, args[1])
			if err != nil {
				return err
			}
			cks = []api.Checkpoint{ck}
		default:
			return usageError{"checkpoints ls [NAME]"}
		}
		if a.json {
			return a.printJSON(cks)
		}
		a.table("NAME\tSTEP\tLATEST\tBYTES\tPARTS\tREPLICAS\tPERSISTED", func(w io.Writer) {
			for _, ck := range cks {
				for _, st := range ck.Steps {
					latest := ""
					if ck.Latest != nil && *ck.Latest == st.Step {
						latest = "*"
					}
					// PARTS counts the step's parts (their names are in --json).
					fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%d\t%d\t%v\n", esc(ck.Name), st.Step, latest, humanize.IBytes(uint64(st.Bytes)),
						len(st.Parts), st.Replicas, st.Persisted)
				}
			}
		})
		return nil
	case "rm":
		if len(args) != 2 {
			return usageError{"checkpoints rm NAME"}
		}
		return a.c.DeleteCheckpoint(ctx, args[1])
	}
	return usageError{"checkpoints ls [NAME] | rm NAME"}
}
