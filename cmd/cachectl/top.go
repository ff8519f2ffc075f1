package main

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"net/url"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/dustin/go-humanize"
	"github.com/gdamore/tcell/v2"

	"stallfree/api"
	"stallfree/client"
)

// cachectl top: one screen of the cluster, refreshed every second — members
// (memory, requests/s and the hit/peer/miss mix), datasets (cached share,
// quota, warm-up), jobs (a wait-share bar per rank, stragglers marked) and
// checkpoints. Off a terminal it prints one snapshot as plain text.

// topSnapshot is what one refresh gathered. Rates come from the counters'
// change since the previous snapshot (none on the first).
type topSnapshot struct {
	at          time.Time
	leader      string
	members     []topMember
	datasets    []topDataset
	jobs        []api.JobInfo
	checkpoints []api.Checkpoint
	errs        []string // what could not be asked (a member down): shown, not fatal
}

type topMember struct {
	name, state       string
	used, capacity    uint64
	stats             *client.Stats // nil: it did not answer
	reqPerS           float64
	hit, peer, miss   float64 // shares of the requests since the last snapshot (all time on the first)
	items             int
	datasetItems      map[string]int
	warmDone, warmAll map[string]int64
}

type topDataset struct {
	name             string
	items, cached    int
	quota            *uint64
	warmDone, warmOf int64
	derivedFrom      string
}

func (a *app) top(ctx context.Context, args []string) error {
	if _, err := parseCommand(flag.NewFlagSet("top", flag.ContinueOnError), args, 0, "top"); err != nil {
		return err
	}
	snap := a.topGather(ctx, nil)
	if !a.tty || a.json {
		if a.json {
			return a.printJSON(snap.jobs)
		}
		_, err := io.WriteString(a.out, renderTop(snap, false))
		return err
	}
	return a.topScreen(ctx, snap)
}

// topScreen draws snapshots on the terminal every second until q, Esc or
// Ctrl-C (tcell handles the terminal's modes and its restoring).
func (a *app) topScreen(ctx context.Context, snap topSnapshot) error {
	screen, err := tcell.NewScreen()
	if err != nil {
		return err
	}
	if err := screen.Init(); err != nil {
		return err
	}
	defer screen.Fini()
	quit := make(chan struct{})
	go func() {
		for {
			switch ev := screen.PollEvent().(type) {
			case nil:
				return // Fini
			case *tcell.EventKey:
				if ev.Key() == tcell.KeyEscape || ev.Key() == tcell.KeyCtrlC || ev.Rune() == 'q' {
					close(quit)
					return
				}
			case *tcell.EventResize:
				screen.Sync()
			}
		}
	}()
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		drawScreen(screen, renderTop(snap, true))
		select {
		case <-ctx.Done():
			return nil
		case <-quit:
			return nil
		case <-t.C:
			snap = a.topGather(ctx, &snap)
		}
	}
}

func drawScreen(screen tcell.Screen, text string) {
	screen.Clear()
	bold := tcell.StyleDefault.Bold(true)
	for y, line := range strings.Split(text, "\n") {
		style := tcell.StyleDefault
		if line == strings.ToUpper(line) && line != "" { // section and column titles
			style = bold
		}
		if strings.Contains(line, "STRAGGLER") {
			style = style.Foreground(tcell.ColorRed)
		}
		for x, r := range []rune(line) {
			screen.SetContent(x, y, r, nil, style)
		}
	}
	screen.Show()
}

// topGather asks the cluster for one snapshot; prev (nil on the first) gives
// the rates.
func (a *app) topGather(ctx context.Context, prev *topSnapshot) topSnapshot {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	s := topSnapshot{at: time.Now()}
	fail := func(what string, err error) { s.errs = append(s.errs, fmt.Sprintf("%s: %v", what, err)) }
	cl, err := a.c.Cluster(ctx)
	if err != nil {
		fail("cluster", err)
		return s
	}
	s.leader = cl.Leader
	dss, err := a.c.Datasets(ctx)
	if err != nil {
		fail("datasets", err)
	}
	for _, m := range cl.Members {
		tm := topMember{name: m.Name, state: m.State, capacity: m.Capacity, datasetItems: map[string]int{},
			warmDone: map[string]int64{}, warmAll: map[string]int64{}}
		if m.State == "alive" && m.HTTP != "" {
			c := client.New(m.HTTP, a.c.Token)
			if m.Name == cl.Self {
				c = a.c
			}
			if st, err := c.Stats(ctx); err == nil {
				tm.stats, tm.used, tm.capacity, tm.items = &st, st.UsedBytes, st.CapacityBytes, st.ItemsCached
				for _, u := range st.Datasets {
					tm.datasetItems[u.Name] = u.Items
				}
				for _, d := range dss {
					if p, err := c.Warmup(ctx, d.Name); err == nil {
						tm.warmDone[d.Name], tm.warmAll[d.Name] = p.Done, p.Total
					}
				}
			} else {
				fail(m.Name, err)
			}
		}
		tm.rates(prev, s.at)
		s.members = append(s.members, tm)
	}
	for _, d := range dss {
		td := topDataset{name: d.Name, items: d.Items, quota: d.Quota, derivedFrom: d.DerivedFrom}
		for _, m := range s.members {
			td.cached += m.datasetItems[d.Name]
			td.warmDone += m.warmDone[d.Name]
			td.warmOf += m.warmAll[d.Name]
		}
		s.datasets = append(s.datasets, td)
	}
	jobs, err := a.c.Jobs(ctx)
	if err != nil {
		fail("jobs", err)
	}
	for _, j := range jobs {
		var info api.JobInfo
		if err := a.c.JSON(ctx, "GET", "/v1/jobs/"+url.PathEscape(j.Name), nil, &info); err != nil {
			fail("job "+j.Name, err)
			continue
		}
		s.jobs = append(s.jobs, info)
	}
	if cks, err := a.c.Checkpoints(ctx); err == nil {
		s.checkpoints = cks
	}
	return s
}

// rates sets the member's requests/s and mix from the change of its
// counters since prev's snapshot of it (all time when there is none).
func (m *topMember) rates(prev *topSnapshot, now time.Time) {
	if m.stats == nil {
		return
	}
	hit, peer, miss := float64(m.stats.HitsLocal), float64(m.stats.HitsPeer), float64(m.stats.Misses)
	if prev != nil {
		for _, p := range prev.members {
			if p.name == m.name && p.stats != nil {
				hit -= float64(p.stats.HitsLocal)
				peer -= float64(p.stats.HitsPeer)
				miss -= float64(p.stats.Misses)
				if dt := now.Sub(prev.at).Seconds(); dt > 0 {
					m.reqPerS = (hit + peer + miss) / dt
				}
			}
		}
	}
	if tot := hit + peer + miss; tot > 0 {
		m.hit, m.peer, m.miss = hit/tot, peer/tot, miss/tot
	}
}

// barWidth is the wait-share bar's length in cells.
const barWidth = 20

// bar draws a share (0..1) as a bar; blocks on a terminal, # off one.
func bar(share float64, tty bool) string {
	full, empty := "#", "."
	if tty {
		full, empty = "█", "░"
	}
	n := int(share*barWidth + 0.5)
	n = max(0, min(barWidth, n))
	return strings.Repeat(full, n) + strings.Repeat(empty, barWidth-n)
}

// renderTop lays a snapshot out as text (every string from the cluster
// escaped).
func renderTop(s topSnapshot, tty bool) string {
	var b bytes.Buffer
	quit := ""
	if tty {
		quit = "   (q quits)"
	}
	fmt.Fprintf(&b, "stallfree top — %d members, leader %s — %s%s\n\n", len(s.members), esc(s.leader), s.at.Format("15:04:05"), quit)
	table := func(title, header string, rows func(w io.Writer)) {
		fmt.Fprintln(&b, title)
		w := tabwriter.NewWriter(&b, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, header)
		rows(w)
		w.Flush()
		fmt.Fprintln(&b)
	}
	table("MEMBERS", "NAME\tSTATE\tMEMORY\tITEMS\tREQ/S\tHIT\tPEER\tMISS", func(w io.Writer) {
		for _, m := range s.members {
			if m.stats == nil {
				fmt.Fprintf(w, "%s\t%s\t-\t-\t-\t-\t-\t-\n", esc(m.name), esc(m.state))
				continue
			}
			fmt.Fprintf(w, "%s\t%s\t%s / %s\t%d\t%.0f\t%.0f%%\t%.0f%%\t%.0f%%\n", esc(m.name), esc(m.state),
				humanize.IBytes(m.used), humanize.IBytes(m.capacity), m.items, m.reqPerS, 100*m.hit, 100*m.peer, 100*m.miss)
		}
	})
	table("DATASETS", "NAME\tITEMS\tCACHED\tQUOTA\tWARM-UP", func(w io.Writer) {
		for _, d := range s.datasets {
			cached, quota, warm := "-", "-", "-"
			if d.items > 0 {
				cached = fmt.Sprintf("%.0f%%", 100*float64(d.cached)/float64(d.items))
			}
			if d.quota != nil {
				quota = humanize.IBytes(*d.quota)
			}
			if d.warmOf > 0 {
				warm = fmt.Sprintf("%d/%d", d.warmDone, d.warmOf)
			}
			name := esc(d.name)
			if d.derivedFrom != "" {
				name += " (prep of " + esc(d.derivedFrom) + ")"
			}
			fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%s\n", name, d.items, cached, quota, warm)
		}
	})
	table("JOBS (last 60 s)", "JOB\tRANK\tNODE\tWAIT SHARE\t\tSTEP\tSAMPLES/S\t", func(w io.Writer) {
		for _, j := range s.jobs {
			if len(j.Stall) == 0 {
				fmt.Fprintf(w, "%s\t-\t\tno reports\t\t\t\t\n", esc(j.Name))
			}
			for _, r := range j.Stall {
				mark := ""
				if r.Straggler {
					mark = "STRAGGLER"
				}
				fmt.Fprintf(w, "%s\t%d\t%s\t%s\t%3.0f%%\t%.3fs\t%.0f\t%s\n", esc(j.Name), r.Rank, esc(r.Node), bar(r.WaitShare, tty),
					100*r.WaitShare, r.StepS, r.SamplesPerS, mark)
			}
		}
	})
	table("CHECKPOINTS", "NAME\tLATEST\tSTEPS\tPERSISTED", func(w io.Writer) {
		for _, c := range s.checkpoints {
			latest, persisted := "-", "-"
			if c.Latest != nil {
				latest = fmt.Sprint(*c.Latest)
			}
			if n := len(c.Steps); n > 0 {
				persisted = fmt.Sprint(c.Steps[n-1].Persisted)
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\n", esc(c.Name), latest, len(c.Steps), persisted)
		}
	})
	slices.Sort(s.errs)
	for _, e := range s.errs {
		fmt.Fprintf(&b, "unanswered: %s\n", esc(e))
	}
	return b.String()
}
