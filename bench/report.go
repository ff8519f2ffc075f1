package bench

import (
	"encoding/json"
	"fmt"
	"image/color"
	"os"
	"path/filepath"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// WriteReport writes the markdown report and its plots.
func WriteReport(rep *Report, out, doc string) error {
	if err := readSidecars(rep, out); err != nil {
		return err
	}
	if err := plotSweep(rep, filepath.Join(out, "throughput_vs_concurrency.png")); err != nil {
		return err
	}
	if err := plotPolicies(rep, filepath.Join(out, "storage_reads_per_policy.png")); err != nil {
		return err
	}
	if err := plotLocality(rep, filepath.Join(out, "remote_fraction_vs_batch.png")); err != nil {
		return err
	}
	text := Markdown(rep, out)
	// Sections other benchmarks wrote (python -m stallfree.bench modes) sit
	// below KeptMarker and survive a rewrite.
	if old, err := os.ReadFile(doc); err == nil {
		if i := strings.Index(string(old), KeptMarker); i >= 0 {
			text = strings.TrimRight(text, "\n") + "\n\n" + string(old[i:])
		}
	}
	return os.WriteFile(doc, []byte(text), 0o644)
}

// KeptMarker starts the part of BENCHMARKS.md that make bench keeps as it is.
const KeptMarker = "<!-- kept by make bench: sections of other benchmarks below -->"

// ReadReport reads the results.json a run wrote.
func ReadReport(file string) (*Report, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	var rep Report
	if err := json.Unmarshal(b, &rep); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	return &rep, readSidecars(&rep, filepath.Dir(file))
}

// Markdown is the report's text, with plots and raw numbers under out.
func Markdown(rep *Report, out string) string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	m := rep.Medians
	w("# Benchmarks\n\nProduced by `make bench` (%s, %.0f s). Machine: %s.\n\n", strings.Join(rep.Commands, " "), rep.DurationS, rep.Machine)
	w("Every server runs on loopback on this machine, on the same %v items of %v bytes, with %v connections; targets\n",
		rep.Config["items"], rep.Config["size"], rep.Config["concurrency"])
	w("alternate in %v rounds of %vs and the tables show medians. Client and servers share the two cores, so compare\n", rep.Config["rounds"], rep.Config["seconds"])
	w("ratios within this run and read server CPU per request beside them. Raw numbers: `%s`.\n\n", filepath.Join(out, "results.json"))
	w("## Throughput\n\n| target | req/s | items/s | MB/s | p50 µs | p99 µs | server CPU µs/req |\n|---|---|---|---|---|---|---|\n")
	for _, name := range []string{"stallfree-local", "nginx", "memcached", "stallfree-local-2node", "stallfree-peer", "stallfree-batch64", "raw-tcp"} {
		r := m[name]
		w("| %s | %.0f | %.0f | %.0f | %.0f | %.0f | %.1f |\n", name, r.ReqPerSec, r.ItemsPerSec, r.MBPerSec, r.P50us, r.P99us, r.CPUusPerReq)
	}
	w("\nmemcpy of item-sized buffers from DRAM: %.1f GB/s.\n\n", rep.Memcpy)
	w("## Ratios (the design goals)\n\n| ratio | measured | goal |\n|---|---|---|\n")
	goal := map[string]string{"local_vs_nginx": "≥ 1.0", "local_vs_memcached": "≥ 1.0", "peer_vs_local": "≥ 0.7", "batch_vs_single": "≥ 1.5", "local_vs_raw_tcp": "(ceiling)"}
	for _, k := range []string{"local_vs_nginx", "local_vs_memcached", "peer_vs_local", "batch_vs_single", "local_vs_raw_tcp"} {
		w("| %s | %.2f | %s |\n", k, rep.Ratios[k], goal[k])
	}
	if parts := m["stallfree-peer"].CPUParts; parts != nil {
		w("\nServer CPU of a peer hit by node: requester %.1f µs, owner %.1f µs per request (a local hit on the same node: %.1f µs).\n",
			parts["requester"], parts["owner"], m["stallfree-local-2node"].CPUusPerReq)
	}
	w("\n`peer_vs_local` compares, on one node of a 2-node cluster, items the other node owns with items it owns;\n")
	w("`batch_vs_single` compares items/s of 64-item batch requests with single GETs on the same node.\n\n")
	w("![throughput vs concurrency](%s)\n\n", filepath.Join(out, "throughput_vs_concurrency.png"))
	w("## Memory\n\n| item size | cached | RSS / cached | Go heap | GCs in 5 s churn | GC pause p99 | max |\n|---|---|---|---|---|---|---|\n")
	for _, r := range rep.Memory {
		w("| %d B | %.2f GiB | %.3f | %d MiB | %d | %.0f µs | %.0f µs |\n", r.ItemSize, float64(r.CachedBytes)/(1<<30), r.RSSRatio, r.Heap>>20, r.GCs, r.PauseP99us, r.PauseMaxus)
	}
	if nm := rep.NodeMemory; nm != nil {
		w("\nA real `cachenode` with %.2f GiB of %v-byte items cached, after warm-up and 5 s of random GETs (%.0f req/s):\n", float64(nm.CachedBytes)/(1<<30), rep.Config["size"], nm.ReqPerSec)
		w("RSS %.3fx the cached bytes, Go heap %d MiB. ", nm.RSSRatio, nm.HeapBytes>>20)
		if nm.LoadGCs == 0 {
			w("No collection ran under the load")
		} else {
			w("Under the load: %d GC pauses, p99 ≤ %.0f µs (the upper bound of the runtime histogram's bucket)", nm.LoadGCs, nm.LoadPauseP99)
		}
		if nm.GCs == 0 {
			w(", nor over the node's life, warm-up included.\n")
		} else {
			w("; %d collections over the node's life, warm-up included, the longest pause %.0f µs.\n", nm.GCs, nm.GCPauseMax)
		}
	}
	w("\nThe table is measured in the bench process with the store package and the memory limit `cachenode` sets; churn replaces\n")
	w("items under LRU while allocating request-sized garbage. A running node after warm-up: RSS %d MiB for %d MiB\n", rep.NodeRSS["rss"]>>20, rep.NodeRSS["cached_bytes"]>>20)
	w("cached (%.2fx, including the Go runtime, fasthttp and raft).\n\n", float64(rep.NodeRSS["rss"])/float64(max(rep.NodeRSS["cached_bytes"], 1)))
	w("## Cache policies: storage reads per epoch\n\nOne node, 2000 items of 4 KiB, a job of batch 50 read in its own order, 2 ms per batch of \"GPU time\".\n\n")
	w("| policy | cache / dataset | reads epoch 0, 1, 2 | loader misses epoch 0, 1, 2 |\n|---|---|---|---|\n")
	for _, p := range rep.Policies {
		w("| %s | %.2f | %v | %v |\n", p.Policy, p.CacheFr, p.Reads, p.Misses)
	}
	w("\n![storage reads per policy](%s)\n\n", filepath.Join(out, "storage_reads_per_policy.png"))
	w("## Locality-aware sampling: share of a rank's samples on another node\n\n20,000 ImageNet-like keys, one rank per node.\n\n| nodes | batch | locality-aware | plain |\n|---|---|---|---|\n")
	for _, l := range rep.Locality {
		w("| %d | %d | %.3f | %.3f |\n", l.Nodes, l.Batch, l.Locality, l.Plain)
	}
	w("\n![remote fraction vs batch size](%s)\n", filepath.Join(out, "remote_fraction_vs_batch.png"))
	if s := rep.S3; s != nil {
		w("\n## S3: a real MinIO server on this machine\n\n")
		w("%d objects of %d KiB in one bucket prefix, %d nodes (`--s3-endpoint`), MinIO on the same 2 cores.\n\n", s.Objects, s.ObjectBytes>>10, s.Nodes)
		w("| | items/s | MB/s |\n|---|---:|---:|\n")
		w("| plain GET loop, %d at once (each object once) | %.0f | %.0f |\n", s.Concurrency, s.LoopItemsPerSec, s.LoopMBPerSec)
		w("| Stallfree warm-up (%d per node, each object read once cluster-wide) | %.0f | %.0f |\n", s.Concurrency/s.Nodes, s.WarmItemsPerSec, s.WarmMBPerSec)
		w("| epoch through one node, nothing cached (16 loader workers) | %.0f | |\n", s.ColdEpochItemsPerSec)
		w("| epoch through one node, warmed | %.0f | |\n\n", s.WarmEpochItemsPerSec)
		if s.WarmNodeCPUus > 0 {
			w("CPU per object: GET loop client %.0f µs, MinIO %.0f µs; warm-up: both nodes %.0f µs, MinIO %.0f µs. Caching writes\n",
				s.LoopClientCPUus, s.LoopMinIOCPUus, s.WarmNodeCPUus, s.WarmMinIOCPUus)
			w("every byte into fresh memory, which the loop does not: on this VM a first touch of the store's huge pages costs\n")
			w("~200–400 µs per 110 KiB item (see the notes), and all of it competes with MinIO for the same two cores.\n\n")
		}
		w("Warm-up / GET loop: **%.2f** (goal ≥ 0.8). Registering a prefix of %d small objects (listing split over its\n", s.WarmVsLoop, s.ListObjects)
		w("common prefixes, manifest through raft): %.1f s.\n", s.RegisterSeconds)
	}
	if l := rep.List; l != nil {
		w("\n### Listing and registering %d keys\n\n", l.Objects)
		w("A manifest-sized bucket: %d keys (`many/dDDDD/oNNNNNNNN.bin`, 1000 a directory) answered by a fake\n", l.Objects)
		w("ListObjectsV2 server in the bench process (`bench/s3fake.go`; MinIO here took ~35k objects a minute, slowing as\n")
		w("the bucket grew), registered on %d nodes through minio-go, the parallel listing over the first level of common\n", l.Nodes)
		w("prefixes, the manifest and raft: **%.1f s**; the larger node's RSS afterwards %d MiB.\n", l.Seconds, l.NodeRSS>>20)
		w("(`sfbench -list-only -list-keys %d`, run beside this report; `make bench` runs it too.)\n", l.Objects)
	}
	if m := rep.Manifest; m != nil {
		writeManifest(w, m)
	}
	if t := rep.Tar; t != nil {
		w("\n## WebDataset tar shards against the same members as files\n\n")
		w("%d samples (a .jpg, a .cls, a .json; %d bytes a sample on average), %d samples a shard, 2 nodes, served from\n", t.Samples, t.SampleBytes, t.PerShard)
		w("memory through one node with 16 connections. A files sample is a `/batch` of its 3 keys.\n\n")
		w("| | tar shards | files | tar / files |\n|---|---:|---:|---:|\n")
		w("| samples/s, one per request | %.0f | %.0f | %.2f |\n", t.TarSinglePerS, t.FilesSinglePerS, t.TarSinglePerS/t.FilesSinglePerS)
		w("| samples/s, 64 per request | %.0f | %.0f | %.2f |\n", t.TarBatchPerS, t.FilesBatchPerS, t.TarBatchPerS/t.FilesBatchPerS)
		w("| warm-up MB/s (shards: each read once, front to back, samples pushed to owners; files: owners read their share) | %.0f | %.0f | %.2f |\n", t.TarWarmMBPerS, t.FilesWarmMBPerS, t.TarWarmMBPerS/t.FilesWarmMBPerS)
		w("| registration s | %.2f | %.2f | |\n", t.TarRegisterS, t.FilesRegisterS)
	}
	if len(rep.Routing) > 0 {
		w("\n## Owner routing: reads sent to each item's owner\n\n")
		w("Random reads of all %v items (a random-order epoch) on a warm cluster, the same Go load client with %v connections\n", rep.Config["items"], rep.Config["concurrency"])
		w("per node it talks to: every request through one node (a peer hit for the items others own), each request to its\n")
		w("item's owner by the owner table (`Client(route=\"owner\")`), and the all-local reference (one node's own items\n")
		w("read from it). CPU is the sum over all nodes per item; client and nodes share the 2 cores.\n\n")
		w("| nodes | through one node items/s | owner-routed items/s | all-local items/s | routed / all-local | cluster CPU µs/item: one node · routed · all-local |\n|---|---:|---:|---:|---:|---|\n")
		for _, r := range rep.Routing {
			w("| %d | %.0f | %.0f | %.0f | **%.2f** | %.1f · %.1f · %.1f |\n", r.Nodes, r.OneNode.ItemsPerSec, r.Routed.ItemsPerSec, r.AllLocal.ItemsPerSec,
				r.RoutedVsLocal, r.OneNode.CPUusPerReq, r.Routed.CPUusPerReq, r.AllLocal.CPUusPerReq)
		}
		w("\nGoal: owner-routed ≥ 0.9× all-local.\n")
	}
	if len(rep.BatchSizes) > 0 {
		w("\n## Batches of small items\n\nOne node, %v items per size, 64-item `/batch` requests against single GETs (%v connections).\n\n", rep.Config["items"], rep.Config["concurrency"])
		w("| item size | single items/s | batch64 items/s | batch64 / single | goal |\n|---|---:|---:|---:|---|\n")
		goals := map[int]string{4 << 10: "≥ 5", 16 << 10: "≥ 2.5"}
		for _, b := range rep.BatchSizes {
			w("| %d KiB | %.0f | %.0f | **%.2f** | %s |\n", b.Size>>10, b.Single.ItemsPerSec, b.Batch.ItemsPerSec, b.Ratio, goals[b.Size])
		}
		w("| %d KiB (main table) | %.0f | %.0f | **%.2f** | ≥ 1.5 |\n", asInt(rep.Config["size"])>>10, m["stallfree-local"].ItemsPerSec, m["stallfree-batch64"].ItemsPerSec, rep.Ratios["batch_vs_single"])
	}
	if a := rep.Analyze; a != nil {
		w("\n## `cachectl analyze`: predicted against measured\n\n")
		w("One node, %d items of %d KiB, storage throttled to %s/s, %d loader workers. Rates measured by `stall.Analyze` on a node\n", a.Items, a.ItemBytes>>10, a.SourceRate, a.Workers)
		w("holding everything: cold %.0f items/s, cached %.0f items/s. A node with memory for half the dataset, second epoch:\n\n", a.ColdRate, a.CachedRate)
		w("| hit fraction | predicted | measured | error |\n|---|---|---|---|\n| %.2f | %.2f s | %.2f s | %.1f%% |\n", a.HitFraction, a.Predicted, a.Measured, 100*a.ErrorFr)
	}
	if rep.Split != nil {
		splitSection(w, rep.Split)
	}
	w("%s", notes)
	return b.String()
}

// asInt reads a number of the report's config, an int when measured and a
// float64 when read back from results.json.
func asInt(v any) int {
	switch x := v.(type) {
	case int:
		return x
	case float64:
		return int(x)
	}
	return 0
}

func newPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text, p.X.Label.Text, p.Y.Label.Text = title, x, y
	p.Add(plotter.NewGrid())
	return p
}

func plotSweep(rep *Report, file string) error {
	p := newPlot("GET of one item, random keys", "connections", "requests/s")
	var args []any
	for _, name := range []string{"stallfree-local", "nginx", "memcached"} {
		var pts plotter.XYs
		for _, r := range rep.Sweep {
			if r.Target == name {
				pts = append(pts, plotter.XY{X: float64(r.Conc), Y: r.ReqPerSec})
			}
		}
		args = append(args, name, pts)
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return err
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = ticks(1, 4, 16, 64)
	p.Legend.Top, p.Legend.Left = false, false
	p.Y.Min = 0
	return p.Save(7*vg.Inch, 4*vg.Inch, file)
}

// ticks labels exactly the values measured.
func ticks(vs ...float64) plot.ConstantTicks {
	out := make(plot.ConstantTicks, len(vs))
	for i, v := range vs {
		out[i] = plot.Tick{Value: v, Label: fmt.Sprint(v)}
	}
	return out
}

func plotPolicies(rep *Report, file string) error {
	p := newPlot("Storage reads per later epoch (mean of epochs 1-2)", "cache / dataset", "reads / items")
	w := vg.Points(12)
	colors := map[string]color.Color{"minio": plotutil.Color(0), "lru": plotutil.Color(1), "clairvoyant": plotutil.Color(2)}
	var fracs []string
	for i, pol := range []string{"minio", "lru", "clairvoyant"} {
		var vals plotter.Values
		fracs = fracs[:0]
		for _, r := range rep.Policies {
			if r.Policy == pol && len(r.ReadsFr) == 3 {
				vals = append(vals, (r.ReadsFr[1]+r.ReadsFr[2])/2)
				fracs = append(fracs, fmt.Sprintf("%.2f", r.CacheFr))
			}
		}
		bars, err := plotter.NewBarChart(vals, w)
		if err != nil {
			return err
		}
		bars.Color = colors[pol]
		bars.Offset = vg.Length(i-1) * w
		p.Add(bars)
		p.Legend.Add(pol, bars)
	}
	p.NominalX(fracs...)
	p.Legend.Top = true
	return p.Save(7*vg.Inch, 4*vg.Inch, file)
}

func plotLocality(rep *Report, file string) error {
	p := newPlot("Samples read from another node", "per-rank batch size", "fraction of samples")
	var args []any
	for _, n := range []int{2, 4, 8} {
		var loc, plain plotter.XYs
		for _, r := range rep.Locality {
			if r.Nodes == n {
				loc = append(loc, plotter.XY{X: float64(r.Batch), Y: r.Locality})
				plain = append(plain, plotter.XY{X: float64(r.Batch), Y: r.Plain})
			}
		}
		args = append(args, fmt.Sprintf("locality-aware, %d nodes", n), loc, fmt.Sprintf("plain, %d nodes", n), plain)
	}
	if err := plotutil.AddLinePoints(p, args...); err != nil {
		return err
	}
	p.X.Scale = plot.LogScale{}
	p.X.Tick.Marker = ticks(32, 64, 128, 256)
	p.Legend.Top = true
	p.Y.Min, p.Y.Max = 0, 1.45 // room for the legend above the plain-sampling lines
	return p.Save(7*vg.Inch, 4.5*vg.Inch, file)
}

// notes record what profiling showed and which changes the numbers kept.
// Their figures come from `bin/sfbench -rounds 2 -duration 2s -only
// stallfree-local,nginx[,...]` runs on the machine above, before and after.
const notes = `
## What the profiles showed, and what was kept

Profiles: ` + "`cachenode --pprof 127.0.0.1:6061`" + ` under wrk or ` + "`sfbench -only TARGET`" + `.

- Local hits spent ~80% of their CPU in the kernel sending 110 KiB; Go code (fasthttp, routing, the store) was
  about 5 µs of ~40 µs per request. The response went out as two sends (headers plus the first 4 KiB from
  fasthttp's buffer, then the rest). **Kept:** headers and item bytes leave in one writev(2) straight from the
  store (` + "`httpapi/gather.go`" + `): 39–40 → 33–35 µs/req, 0.82x → ~1.0x nginx.
- **Not kept:** a memfd-backed arena served with sendfile(2), as the design suggests. sendfile hands pages to the
  socket without copying them, but the response headers then need a send of their own in front (with MSG_MORE,
  so they need not leave in a segment of their own), and on this kernel that costs more than the copy it saves. Random
  items from a 2000 × 110 KiB set, 200-byte headers, 16 loopback connections, client in the same process,
  ` + "`cd bench && go test -run '^$' -bench ColdItemSend -benchtime 100000x -count 3 .`" + `, per item: writev from the
  anonymous arena 22.6–23.4 µs; sendfile from a memfd arena 26.8–29.3, from a memfd per item 25.9–28.8, from a
  file per item on ext4 (nginx's case; the page cache's large folios help it) 24.0–25.2. In the node it measured
  41–43 µs/req with or without it; corking the socket around it (TCP_CORK, nginx's tcp_nopush) made it worse
  (50–60 µs). A file per item would also write every cached byte back to disk.
- A larger fasthttp write buffer (128 KiB) also gave one send per response (32–33 µs) but copies every item
  once more; the writev path does the same without the copy.
- Peer hits allocated an item-sized buffer per fetch and the collector ran every few MiB of the small heap:
  ~25% of the requester's CPU in GC and zeroing. **Kept:** GC by headroom (GOGC off, memory limit 128 MiB +
  memory/32, in ` + "`cmd/cachenode`" + `), and peer frames sent with one writev: 7.6k → 9.8–12k req/s. What
  remains is physical on one 2-core box: a peer hit moves every byte through the kernel twice (owner → requester
  → client) and checks its checksum once, ~110 µs of CPU across both nodes against ~33 µs for a local hit, so
  the ratio cannot reach the 0.7 goal here; on separate machines the owner's half runs elsewhere.
- A second profile of a peer hit (` + "`sfbench -pprof -only stallfree-peer`" + `, 8 s per node): the owner spent a
  goroutine per request; **kept:** requests whose items are all resident are answered on the connection's
  reader (` + "`transport.ErrWouldBlock`" + ` sends the rest to a goroutine). The owner's share is now ~35 µs per
  hit, 24 of them the writev. The requester's ~85 µs: writev to the client 24, reading the frame 13.5,
  checking its xxhash64 9.5, allocating and zeroing the item buffer 7, the 60-byte request write 8 (loopback
  runs the receiver's TCP work in the sender's syscall), the rest fasthttp and scheduling. Peer/local stayed
  at 0.36–0.43 in A/B runs (the noise is larger than the change).
- A system-wide ` + "`perf record -a -e cpu-clock -g`" + ` of peer hits (a later session) put 7.1% of all CPU in
  ` + "`runtime.memclrNoHeapPointers`" + `: every fetch zeroed a fresh 110 KiB buffer in memory that had left the caches
  (the heap headroom is 128 MiB). **Kept:** single-item fetches read into buffers from a size-classed pool and
  hand them back when the response has been written (` + "`bufpool/`" + `, ` + "`Item.Release`" + `); when a
  single flight shared the bytes with other callers, none recycles them. 10.3–11k → 13–14k req/s, peer/local
  0.33–0.36 → 0.41–0.45 in A/B runs. The peer connections' 64 KiB read buffer copied up to 64 KiB of each
  payload through it; 4 KiB now (inside the noise, kept as the smaller copy).
- Where a peer hit's CPU goes now (the per-node figures above): the owner spends what a local hit costs, the
  requester about twice that (receive 110 KiB, check its xxhash64, send it on). On one host the client, both
  nodes and the kernel's work for all three share two cores, so with a client costing ~20 µs per request the
  0.7 goal needs both nodes together under ~53 µs per peer hit, less than two local hits. Not reachable by
  tuning here; ` + "`splice(2)`" + ` from the owner's socket through a pipe to the client would save ~10 µs of copies
  (measured in a throwaway program, not in the repository: 41.5 → 31.5 µs per relayed 110 KiB) but gives up
  the requester's checksum check, so it was not done; keeping the check with tee(2) into a second pipe that is
  read back and hashed saved ~4 µs (68 vs 71–74 µs per relayed item, a second throwaway program). On separate
  machines the owner's share runs elsewhere.
- The requester makes ~4.6 reads per peer hit (` + "`perf stat -e 'syscalls:sys_enter_*'`" + `): two on the client
  connection, the rest because a 110 KiB frame arrives in pieces. **Not kept:** SO_RCVLOWAT set to the rest of
  the payload while reading it, so the poller wakes once: 11.9–12.7k against 12.3–13.2k req/s without.
- Dataset names were checked with a regexp on every request (2% of a local hit's CPU); now by hand, fuzzed
  against the regexp (` + "`FuzzValidName`" + `).
- Batches copied all 64 items into one 7 MiB buffer. **Kept:** the msgpack framing is built apart and the items
  go out with the framing in one writev: 24 µs of server CPU per item against 32 µs for single GETs, 1.27–1.42x
  in items/s. Then (a later session) 7 MB responses streamed over 16 loopback connections moved 4.5–4.8 GB/s with
  the kernel's send-buffer autotuning or 2 MiB, 10.2–10.6 GB/s with SO_SNDBUF fixed at 256 KiB and 11.2–11.3 GB/s
  at 512 KiB (` + "`cd bench && go test -run '^$' -bench BatchSendBuffer -benchtime 2000x -count 2 .`" + `): with up to
  4 MiB queued per connection, the receiver copies bytes that left the CPU caches long ago. **Kept:**
  ` + "`--send-buffer`" + `, 512 KiB by default, on every HTTP connection: batch64 36–42k → 51–58k items/s
  (` + "`sfbench -only stallfree-local,stallfree-batch64`" + `, 256 KiB: 49k, 1–2 MiB: 36–41k), single GETs unchanged.
  A fixed buffer caps one connection's throughput near buffer/RTT, so links with a bandwidth-delay product over
  ~1 MiB want a larger value or 0 (autotuning).
- Local hits against memcached (a later session, ` + "`perf record -a`" + `): both spend the same time per request in
  ` + "`_copy_from_iter`" + ` (the one copy of the item into the socket); memcached's server CPU is 24–27 µs and the
  node's 30–33 µs, the difference spread over the Go runtime's scheduling and netpoller (no function above 1%),
  and the machine sat idle 9% of the time with the node against 5% with memcached. Syscall counts
  (` + "`perf stat -e 'syscalls:sys_enter_*'`" + `): memcached makes one read and one sendmsg per request and waits in
  epoll before reading; Go's edge-triggered netpoller makes the node try a read that fails with EAGAIN before
  parking, two reads per request. Both are the runtime's, not the node's; not changed.
- The node's longest GC pause, 2–6 ms in every run, came before the load (pauses under load stayed ≤ 917 µs),
  in the warm-up (` + "`GODEBUG=gctrace=1`" + `: stop-the-world
  phases of up to 1.4 ms while the VM was zeroing fresh pages for the arena, 57% of warm-up CPU in
  ` + "`clear_page_erms`" + `). Every storage read allocated an item-sized buffer, so a 1.1 GiB warm-up ran 7
  collections. **Kept (the fourth session):** storage reads use the pooled buffers too and a warm-up hands them
  back once the item is stored: 0 collections for the same warm-up (a node started with ` + "`GODEBUG=gctrace=1`" + ` and
  ` + "`--memory 1400MiB`" + `, ` + "`cachectl gendata DIR --items 10000`" + `, ` + "`datasets add`" + `, ` + "`warmup`" + `; the ` + "`gc`" + ` lines the
  node printed during the warm-up, two runs of each build).
- With the warm-up no longer leaving garbage behind, a node's Go heap was still small when the load began, and
  each hit's garbage landed in pages never touched before: ` + "`perf stat -e page-faults -p PID`" + ` counted 14.5k faults in
  8 s of ` + "`sfbench -only stallfree-local`" + ` (500 before, when the warm-up's garbage had faulted the heap in), for
  the first ~20 s of load, until the heap reached its limit. **Kept:** a hit allocates one 48-byte string (the
  path) instead of 7 objects, 280 B: path segments go into an array on the stack, the key is cut from the path
  rather than joined, the ETag is built on the stack and the writev's vector is reused per connection
  (` + "`go test -run '^$' -bench LocalHit -benchmem ./httpapi`" + `: 7 → 1 allocs/op). 3.0k faults in the same 8 s;
  req/s unchanged (29.6k for both builds in alternating ` + "`sfbench -rounds 3 -duration 2s`" + ` runs).
- Transparent huge pages are advised for the arena (random reads across GiBs); its effect was inside the noise.
  GOMAXPROCS=1 for the node was worse (33–44 µs/req against 31–35 µs with 2) and was not kept.
- The S3 warm-up against a plain GET loop (a later session): a profile of a warming node
  (` + "`sfbench -pprof -s3-only`" + `) had 55% of its CPU in the memmove of ` + "`store.Put`" + `, the first write to the
  arena's fresh pages. Putting 8000 items of 110 KiB into a new 4 GiB store in a throwaway program: 217–422 µs per
  put with the arena's huge pages (each 2 MiB fault 1.5–3 ms of system time on this VM), 91 µs with 4 KiB pages
  (220k faults of ~3 µs). Huge pages were kept: in alternating runs they saved 6–10 µs of the node's CPU per
  local hit (69 against 75–79 µs, ` + "`sfbench -only stallfree-local,stallfree-batch64 -rounds 2`" + `), paid on every
  read of every epoch, while a first touch is paid once per byte cached. A GET loop stores nothing, so on one
  shared 2-core box the warm-up stays below it; on separate machines MinIO's CPU is elsewhere. Skipping the
  handoff probe that a warming owner sends before each storage read (it asks whether a previous owner holds
  the item) moved the ratio from 0.42 to 0.48 in one pair of runs; it was left in, as a batched probe would
  be the honest fix.
- Registering large directories (a later session; ` + "`sfbench -manifest-only`" + `, 2 nodes). Before: 1 M ImageNet-shaped files
  took 21.6 s, 118 and 172 B of RSS per item on the two nodes (ImageNet's 1.28 M measured ~150 B before), a raft
  directory of 53 MB; 10 M could not be registered in reasonable time. Where it went: the listing was a sequential
  ` + "`filepath.WalkDir`" + ` with ` + "`os.Root.Stat`" + ` of each file's full path, which opens every directory on the way (11 s
  of 1 M, 68% in syscalls); appending raft chunks concatenated the key string, copying it whole per chunk; and the
  manifest kept every key whole (36 B) with 8-byte sizes. **Kept:** a parallel listing, one ` + "`os.Root`" + ` and one
  ` + "`fstatat`" + ` per file beside it, names without DirEntries (1 M: 11 → 3.9 s, timing
  ` + "`Dir.List`" + ` on the benchmark's tree in a throwaway test); front-coded keys in blocks of 16 with
  4-byte sizes (15 B per item in all); raft keeping 256 entries behind a snapshot instead of 10,240 and replicating
  the latest 32 from memory. 1 M then registered in 3.7–7.0 s. At 10 M the leader lost its lease mid-listing in
  every try (` + "`GODEBUG=gctrace=1`" + `: 30 collections, the later ones marking 1–2 GB each for up to 1.9 s, their
  assists stalling raft's heartbeats past 500 ms): the node's collector now runs when garbage reaches the larger of
  its headroom and what is live (GOGC=100 once the heap is large), 15 collections, and the listing's entries are
  joined once instead of grown. Three runs at 10 M: 39.2, 38.1 and 34.4 s; settled RSS per item 21.6, 21.4 and
  21.4 B on the registering node, 18.2, 34.7 and 18.0 B on the other (the second run's other node kept ~170 MB
  more after the collection; not explained yet). These runs listed a tree the kernel had cached (written or listed
  shortly before); the first registration of the 1 M tree after the 10 M one had pushed it out of the inode cache
  took 19.9 s against 6.2 s right after, so a cold tree costs what the disk takes to read its inodes.
- This machine is a shared VM: three full runs in one session gave local/nginx 1.02, 0.86 and 0.88,
  local/memcached 0.87, 0.86 and 0.75, peer/local 0.40, 0.39 and 0.43, batch/single 1.35, 1.30 and 1.27, and
  nginx itself moved between 25.7 and 32.1 µs of CPU per request. A run in the next session gave 1.00, 0.94,
  0.36 and 1.42 (the one before it saw nginx collapse to 505 req/s with 0.5 s tail latencies in its last
  round and was discarded). After the send buffer and the pooled peer buffers a run gave 0.91, 0.83, 0.43 and
  1.68; that day the same machine gave nginx 20 µs of CPU per request and raw TCP 49k req/s, against 26–32 µs
  and 30k before. A fourth session's runs gave 1.01, 0.86, 0.40 and 1.70 (serving code unchanged), then
  0.82, 0.84, 0.40 and 1.53 and, in the run above, 0.90, 0.92, 0.34 and 1.67 (after the pooled storage reads
  and the allocation-free hits below; alternating A/B runs of the builds before and after gave the same req/s
  for local hits, 29.6k, and for peer hits, 11.6–13.5k before and 12.7–13.8k after). Compare within one run.
- Where a local hit's cost over memcached's sits (the fourth session; ` + "`perf record -a -e cpu-clock -g`" + ` during
  ` + "`sfbench -only stallfree-local`" + ` and ` + "`-only memcached`" + `, per request; two runs minutes apart, so differences of a
  few percent are the VM's drift): the send syscall 31.8 µs against 29.0
  (the copy 15.8 against 13.4 of it), user space 7.0 µs (Go runtime, fasthttp and the node) against 2.0
  (memcached, libc, libevent), and the runtime's thread wake-ups and scheduling (futex, schedule, epoll) ~5 µs
  against memcached's 0.8 µs in epoll_wait. ` + "`go tool pprof`" + ` of the node puts the handler itself, routing and the
  store included, at 1.9 µs. A throwaway minimal Go server (not in the repository: a goroutine per connection,
  the request line parsed by hand, one writev of headers and item from a huge-page arena) ran 26.4–26.7k req/s
  at 39 µs against the node's 24.6–25.4k at 43 µs and memcached's 25.7–26.2k at 42–43 µs in the same minutes
  (a slow phase of the VM). So an HTTP path of our own beside fasthttp would buy 5–8% at the price of a second
  HTTP parser, and even then match memcached rather than beat it; not done. Nor does an event loop of our own
  beat Go's netpoller: the same throwaway program with two OS-thread-locked epoll loops (level-triggered, raw
  read and writev) ran 24.3–26.0k req/s at 42–47 µs, in minutes when the node ran 22.8–25.9k at 38–45 µs and
  memcached 24.9–31.9k.
`

func writeManifest(w func(string, ...any), m *ManifestResult) {
	w("\n## Registering %d files: time and memory per item\n\n", m.Items)
	w("A directory of %d sparse files named as ImageNet's (`train/nNNNNNNNN/nNNNNNNNN_N.JPEG`, %.0f bytes a key, 1000 a\n", m.Items, m.KeyLen)
	w("directory), registered through the first of %d nodes with default raft timers: the parallel listing, the\n", m.Nodes)
	w("front-coded manifest in raft chunks, applied on both nodes: **%.1f s** (goal ≤ 60 s for 10 M).\n\n", m.Seconds)
	w("| node | RSS / item settled | of it anonymous | peak during registration / item | raft directory |\n|---|---:|---:|---:|---:|\n")
	for i := range m.PerItem {
		role := "registered it"
		if i > 0 {
			role = "applied it"
		}
		w("| %d (%s) | **%.1f B** | %.1f B | %.0f B | %d MiB |\n", i+1, role, m.PerItem[i], m.AnonPerItem[i], m.PeakPerItem[i], m.RaftBytes[i]>>20)
	}
	w("\nGoal: ≤ 48 B per item settled. Settled is after the node collected and handed free memory back\n")
	w("(`POST /debug/free-memory` on its `--pprof` listener): without that, a node keeps up to its GC headroom\n")
	w("(128 MiB + memory/32) of garbage until the next collection, whatever it holds. RSS before the registration is\n")
	w("measured the same way. The peak is the listing's entries on the node that lists, and decoded chunks.\n")
	w("(`sfbench -manifest-only -manifest-items %d`, run beside this report; `make bench` runs it too, writing the tree once\n", m.Items)
	w("under its -work directory, which takes minutes and %d inodes.)\n", m.Items)
}
