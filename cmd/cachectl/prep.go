package main

import (
	"fmt"
	"io"
	"slices"

	"github.com/dustin/go-humanize"

	"stallfree/client"
)

// The prep cache in cachectl: derived datasets in `datasets ls`, and what
// the cluster's memory holds of each dataset, parent and derived apart, in
// `stats`.

// datasetOrigin is the SOURCE column of `datasets ls`: a derived dataset
// names its parent, its stage and how many of its items are written.
func datasetOrigin(d client.Dataset) string {
	if d.DerivedFrom == "" {
		return esc(d.Source)
	}
	written := 0
	if d.Written != nil {
		written = *d.Written
	}
	// The stage is free text from whoever derived the dataset.
	return fmt.Sprintf("derived from %s, stage %s, %d written", esc(d.DerivedFrom), esc(d.Stage), written)
}

// datasetUsage prints, under the per-node table of `stats`, the items and
// bytes each dataset holds in the whole cluster.
func (a *app) datasetUsage(all []client.Stats) {
	type row struct {
		kind  string
		items int
		bytes uint64
	}
	rows := map[string]*row{}
	for _, s := range all {
		for _, u := range s.Datasets {
			r, ok := rows[u.Name]
			if !ok {
				r = &row{kind: "parent"}
				if u.DerivedFrom != "" {
					r.kind = "derived from " + esc(u.DerivedFrom)
				}
				rows[u.Name] = r
			}
			r.items += u.Items
			r.bytes += u.Bytes
		}
	}
	if len(rows) == 0 {
		return
	}
	fmt.Fprintln(a.out)
	names := make([]string, 0, len(rows))
	for n := range rows {
		names = append(names, n)
	}
	slices.Sort(names)
	a.table("DATASET\tKIND\tITEMS CACHED\tBYTES CACHED", func(w io.Writer) {
		for _, n := range names {
			r := rows[n]
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\n", esc(n), r.kind, r.items, humanize.IBytes(r.bytes))
		}
	})
}
