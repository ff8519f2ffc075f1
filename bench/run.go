package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"sort"
	"strings"
	"time"

	"stallfree/partition"
)

// Config is what `make bench` varies.
type Config struct {
	Items    int           // benchmark items
	Size     int           // bytes per item
	Rounds   int           // alternating rounds per target
	Duration time.Duration // per run
	Conc     int           // connections for the main comparison
	Work     string        // scratch directory (data, logs)
	Bin      string        // directory with cachenode
	Self     string        // this executable, for the raw TCP server
	Out      string        // where results.json and plots go
	Doc      string        // BENCHMARKS.md to write
	MemGiB   float64       // cached GiB for the memory figures
	Only     []string      // when set: only these targets, and no memory, policy or locality runs
	Profile  bool          // serve pprof on every benchmark node (addresses in the log)
	MinIO    string        // a MinIO server binary for the S3 figures (none: skipped)
	// S3Objects and S3List size the S3 figures: objects of Size bytes read
	// in warm-up and epochs, and small objects registered as one dataset.
	S3Objects, S3List int
	// ListKeys sizes the listing figure: a registration of that many keys
	// from a manifest-sized fake bucket (0: skipped).
	ListKeys int
	// ManifestItems sizes the directory dataset whose registration time and
	// memory per item are measured (0: skipped).
	ManifestItems int
	// TarSamples sizes the tar-shard figures (0: skipped).
	TarSamples int
	Log        io.Writer
}

// Report is everything one run measured.
type Report struct {
	Date    string             `json:"date"`
	Machine string             `json:"machine"`
	Config  map[string]any     `json:"config"`
	Memcpy  float64            `json:"memcpy_gb_per_s"`
	Runs    []Result           `json:"runs"`
	Medians map[string]Result  `json:"medians"`
	Sweep   []Result           `json:"sweep"`
	Ratios  map[string]float64 `json:"ratios"`
	NodeRSS map[string]uint64  `json:"node_rss"`
	// NodeMemory is a real cachenode holding MemGiB of items after load.
	NodeMemory *NodeMemResult   `json:"node_memory"`
	Memory     []MemResult      `json:"memory"`
	Policies   []PolicyResult   `json:"policies"`
	Locality   []LocalityResult `json:"locality"`
	// Analyze is cachectl analyze's prediction against a measured epoch.
	Analyze *AnalyzeResult `json:"analyze,omitempty"`
	S3      *S3Result      `json:"s3,omitempty"`
	Tar     *TarResult     `json:"tar,omitempty"`
	List    *ListResult    `json:"s3_list,omitempty"`
	// Manifest is a large directory dataset's registration and memory.
	Manifest *ManifestResult `json:"manifest,omitempty"`
	// Routing is owner routing against reads through one node, by cluster size.
	Routing []*RoutingResult `json:"routing,omitempty"`
	// BatchSizes is batch64 against single GETs by item size.
	BatchSizes []BatchSizeResult `json:"batch_sizes,omitempty"`
	Commands   []string          `json:"commands"`
	DurationS  float64           `json:"duration_s"`

	// Split is read from split.json beside results.json (bench/split.go).
	Split *SplitResult `json:"-"`
}

func (c *Config) logf(format string, args ...any) { fmt.Fprintf(c.Log, format+"\n", args...) }

// pprofArgs gives node name a pprof address when profiling.
func (c *Config) pprofArgs(name string) []string {
	if !c.Profile {
		return nil
	}
	addr := freePort()
	c.logf("node %s: pprof at http://%s/debug/pprof/", name, addr)
	return []string{"--pprof", addr}
}

// Main runs every benchmark and writes the report.
func Main(c Config) (*Report, error) {
	start := time.Now()
	rep := &Report{Date: start.UTC().Format(time.RFC3339), Machine: machine(), Medians: map[string]Result{},
		Ratios: map[string]float64{}, NodeRSS: map[string]uint64{},
		Config: map[string]any{"items": c.Items, "size": c.Size, "rounds": c.Rounds, "seconds": c.Duration.Seconds(), "concurrency": c.Conc}}
	dataDir := filepath.Join(c.Work, "data")
	keys, err := WriteFixed(dataDir, c.Items, c.Size)
	if err != nil {
		return nil, err
	}
	c.logf("data: %d items of %d bytes in %s", c.Items, c.Size, dataDir)
	rep.Memcpy = Memcpy(c.Size, time.Second)
	c.logf("memcpy %d-byte buffers from DRAM: %.2f GB/s", c.Size, rep.Memcpy)

	var procs []*proc
	defer func() {
		for _, p := range procs {
			p.stop()
		}
	}()
	rawAddr := freePort()
	raw, err := startProc("raw", filepath.Join(c.Work, "raw.log"), c.Self, "-serve-raw", rawAddr, "-size", fmt.Sprint(c.Size))
	if err != nil {
		return nil, err
	}
	procs = append(procs, raw)
	ngx, ngxAddr, err := startNginx(c.Work, dataDir)
	if err != nil {
		return nil, err
	}
	procs = append(procs, ngx)
	readFile := func(k string) []byte { b, _ := os.ReadFile(filepath.Join(dataDir, k)); return b }
	mc, mcAddr, err := startMemcached(c.Work, keys, readFile)
	if err != nil {
		return nil, err
	}
	procs = append(procs, mc)
	mem := fmt.Sprintf("%dMiB", c.Items*(c.Size+4096)>>20+64)
	bin := filepath.Join(c.Bin, "cachenode")
	a, err := startNode(c.Work, bin, "a", mem, "", c.pprofArgs("a")...)
	if err != nil {
		return nil, err
	}
	procs = append(procs, a.proc)
	b, err := startNode(c.Work, bin, "b", mem, "", c.pprofArgs("b")...)
	if err != nil {
		return nil, err
	}
	procs = append(procs, b.proc)
	cc, err := startNode(c.Work, bin, "c", mem, b.gossip, c.pprofArgs("c")...)
	if err != nil {
		return nil, err
	}
	procs = append(procs, cc.proc)
	if err := waitTCP(rawAddr, 10*time.Second); err != nil {
		return nil, err
	}
	for _, n := range []*nodeProc{a, b} {
		if err := register(n, "bench", dataDir); err != nil {
			return nil, err
		}
	}
	// Wait until both cluster members see each other, then warm every node.
	if err := waitMembers(b, 2); err != nil {
		return nil, err
	}
	if err := warm([]*nodeProc{a}, "bench"); err != nil {
		return nil, err
	}
	if err := warm([]*nodeProc{b, cc}, "bench"); err != nil {
		return nil, err
	}
	ring, _ := partition.New([]string{"b", "c"})
	var ownB, ownC []string
	for _, k := range keys {
		if ring.Owner("bench", k) == "b" {
			ownB = append(ownB, k)
		} else {
			ownC = append(ownC, k)
		}
	}
	sa, _ := a.c.Stats(context.Background())
	rep.NodeRSS["cached_bytes"] = sa.BytesCached
	rep.NodeRSS["rss"] = rssOf(a.cmd.Process.Pid)
	c.logf("node a caches %d items, %d bytes; RSS %d", sa.ItemsCached, sa.BytesCached, rep.NodeRSS["rss"])

	itemPaths := func(ks []string) []string {
		out := make([]string, len(ks))
		for i, k := range ks {
			out[i] = "/v1/datasets/bench/items/" + k
		}
		return out
	}
	nginxPaths := make([]string, len(keys))
	for i, k := range keys {
		nginxPaths[i] = "/" + k
	}
	batchBody := func(r *rand.Rand) []byte {
		idx := make([]int, 64)
		for i := range idx {
			idx[i] = r.IntN(len(keys))
		}
		b, _ := json.Marshal(map[string][]int{"indices": idx})
		return b
	}
	peer := HTTPGet("stallfree-peer", b.http, func() []int { return append(b.pids(), cc.pids()...) }, itemPaths(ownC), "")
	peer.Parts = map[string]func() []int{"requester": b.pids, "owner": cc.pids}
	targets := []*Target{
		HTTPGet("stallfree-local", a.http, a.pids, itemPaths(keys), ""),
		HTTPGet("nginx", ngxAddr, ngx.pids, nginxPaths, ""),
		Memcached("memcached", mcAddr, mc.pids, keys),
		peer,
		HTTPGet("stallfree-local-2node", b.http, func() []int { return append(b.pids(), cc.pids()...) }, itemPaths(ownB), ""),
		HTTPPost("stallfree-batch64", a.http, a.pids, "/v1/datasets/bench/batch", 64, "", batchBody),
		RawTCP("raw-tcp", rawAddr, raw.pids, c.Size),
	}
	if len(c.Only) > 0 {
		targets = slices.DeleteFunc(targets, func(t *Target) bool { return !slices.Contains(c.Only, t.Name) })
	}
	for _, t := range targets { // warm connections, page cache and code paths
		if _, err := Run(t, c.Conc, time.Second/2); err != nil {
			return nil, err
		}
	}
	for round := range c.Rounds {
		for _, t := range targets {
			res, err := Run(t, c.Conc, c.Duration)
			if err != nil {
				return nil, err
			}
			rep.Runs = append(rep.Runs, res)
			c.logf("round %d %-22s %8.0f req/s %8.0f items/s %7.0f MB/s p50 %5.0fµs p99 %6.0fµs cpu %5.1fµs/req err %d%s",
				round, t.Name, res.ReqPerSec, res.ItemsPerSec, res.MBPerSec, res.P50us, res.P99us, res.CPUusPerReq, res.Errors, partsText(res.CPUParts))
		}
	}
	for _, t := range targets {
		rep.Medians[t.Name] = median(rep.Runs, t.Name)
	}
	if len(c.Only) > 0 {
		return rep, nil
	}
	for _, conc := range []int{1, 4, 16, 64} {
		for _, t := range targets[:3] {
			res, err := Run(t, conc, c.Duration/2)
			if err != nil {
				return nil, err
			}
			rep.Sweep = append(rep.Sweep, res)
			c.logf("sweep c=%-3d %-16s %8.0f req/s", conc, t.Name, res.ReqPerSec)
		}
	}
	m := rep.Medians
	rep.Ratios["local_vs_nginx"] = m["stallfree-local"].ReqPerSec / m["nginx"].ReqPerSec
	rep.Ratios["local_vs_memcached"] = m["stallfree-local"].ReqPerSec / m["memcached"].ReqPerSec
	rep.Ratios["peer_vs_local"] = m["stallfree-peer"].ReqPerSec / m["stallfree-local-2node"].ReqPerSec
	rep.Ratios["batch_vs_single"] = m["stallfree-batch64"].ItemsPerSec / m["stallfree-local"].ItemsPerSec
	rep.Ratios["local_vs_raw_tcp"] = m["stallfree-local"].MBPerSec / m["raw-tcp"].MBPerSec
	for _, p := range procs {
		p.stop()
	}
	procs = nil

	if err := RoutingAndBatches(&c, rep, dataDir); err != nil {
		return nil, err
	}

	target := uint64(c.MemGiB * float64(1<<30))
	if rep.NodeMemory, err = nodeMemory(&c, target); err != nil {
		return nil, err
	}
	for _, size := range []int{110 << 10, 4 << 10} {
		r, err := Memory(size, target, 5*time.Second)
		if err != nil {
			return nil, err
		}
		rep.Memory = append(rep.Memory, r)
		c.logf("memory %6d-byte items: %d cached bytes, RSS %.3fx, heap %d MiB, churn: %d GCs, pause p99 %.0fµs max %.0fµs",
			size, r.CachedBytes, r.RSSRatio, r.Heap>>20, r.GCs, r.PauseP99us, r.PauseMaxus)
		runtime.GC()
	}
	if rep.Policies, err = Policies(c.Work, 2000, 4096, []float64{0.25, 0.5, 0.75}, 2*time.Millisecond); err != nil {
		return nil, err
	}
	for _, p := range rep.Policies {
		c.logf("policy %-11s C/N %.2f reads/epoch %v misses %v", p.Policy, p.CacheFr, p.Reads, p.Misses)
	}
	if rep.Locality, err = Locality(20000, []int{2, 4, 8}, []int{32, 64, 128, 256}); err != nil {
		return nil, err
	}
	if rep.Analyze, err = Analyze(c.Work, filepath.Join(c.Bin, "cachenode")); err != nil {
		return nil, fmt.Errorf("analyze: %w", err)
	}
	if c.MinIO != "" {
		if rep.S3, err = S3(&c, c.MinIO, c.S3Objects, c.Size, c.S3List); err != nil {
			return nil, fmt.Errorf("s3: %w", err)
		}
		s := rep.S3
		c.logf("s3: GET loop %.0f items/s %.0f MB/s; warm-up %.0f items/s %.0f MB/s (%.2fx); epoch cold %.0f, warm %.0f items/s; %d objects registered in %.1fs",
			s.LoopItemsPerSec, s.LoopMBPerSec, s.WarmItemsPerSec, s.WarmMBPerSec, s.WarmVsLoop, s.ColdEpochItemsPerSec, s.WarmEpochItemsPerSec, s.ListObjects, s.RegisterSeconds)
	}
	if c.ListKeys > 0 {
		if rep.List, err = S3List(&c, c.ListKeys); err != nil {
			return nil, fmt.Errorf("s3 listing: %w", err)
		}
		c.logf("s3 listing: %d keys registered in %.1fs, node RSS %d MiB", rep.List.Objects, rep.List.Seconds, rep.List.NodeRSS>>20)
	}
	if c.ManifestItems > 0 {
		if rep.Manifest, err = Manifest(&c, c.ManifestItems); err != nil {
			return nil, fmt.Errorf("manifest: %w", err)
		}
		m := rep.Manifest
		c.logf("manifest: %d files registered in %.1fs; RSS per item %.1f and %.1f B", m.Items, m.Seconds, m.PerItem[0], m.PerItem[1])
	}
	if c.TarSamples > 0 {
		if rep.Tar, err = Tar(&c, c.TarSamples, c.Size/8, 500, c.Duration); err != nil {
			return nil, fmt.Errorf("tar: %w", err)
		}
		t := rep.Tar
		c.logf("tar: samples/s single %.0f (files %.0f), batch64 %.0f (files %.0f); warm-up %.0f MB/s (files %.0f)",
			t.TarSinglePerS, t.FilesSinglePerS, t.TarBatchPerS, t.FilesBatchPerS, t.TarWarmMBPerS, t.FilesWarmMBPerS)
	}
	an := rep.Analyze
	c.logf("analyze: half-memory epoch %.2fs measured, %.2fs predicted (%.1f%% off) at hit fraction %.2f",
		an.Measured, an.Predicted, 100*an.ErrorFr, an.HitFraction)
	rep.DurationS = time.Since(start).Seconds()
	return rep, nil
}

// RoutingAndBatches adds the owner-routing rows (2 and 4 nodes) and the
// batch-by-item-size rows (4 KiB, 16 KiB; the main table has c.Size) to rep.
func RoutingAndBatches(c *Config, rep *Report, dataDir string) error {
	for _, n := range []int{2, 4} {
		r, err := Routing(c, dataDir, c.Items, n)
		if err != nil {
			return fmt.Errorf("routing on %d nodes: %w", n, err)
		}
		rep.Routing = append(rep.Routing, r)
		c.logf("routing %d nodes: through one node %.0f, owner-routed %.0f, all-local %.0f items/s (%.2fx); cluster CPU %.1f / %.1f / %.1f µs/item",
			n, r.OneNode.ItemsPerSec, r.Routed.ItemsPerSec, r.AllLocal.ItemsPerSec, r.RoutedVsLocal,
			r.OneNode.CPUusPerReq, r.Routed.CPUusPerReq, r.AllLocal.CPUusPerReq)
	}
	bs, err := BatchSizes(c, c.Items, []int{4 << 10, 16 << 10})
	if err != nil {
		return fmt.Errorf("batch sizes: %w", err)
	}
	rep.BatchSizes = bs
	for _, b := range bs {
		c.logf("batch64/single at %d B: %.0f / %.0f items/s = %.2fx", b.Size, b.Batch.ItemsPerSec, b.Single.ItemsPerSec, b.Ratio)
	}
	return nil
}

// partsText renders per-process CPU for the log, in a stable order.
func partsText(parts map[string]float64) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(parts)) {
		fmt.Fprintf(&b, " %s %.1fµs", k, parts[k])
	}
	return b.String()
}

func median(runs []Result, name string) Result {
	var rs []Result
	for _, r := range runs {
		if r.Target == name {
			rs = append(rs, r)
		}
	}
	if len(rs) == 0 {
		return Result{Target: name}
	}
	pick := func(f func(Result) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	var parts map[string]float64
	for part := range rs[0].CPUParts {
		if parts == nil {
			parts = map[string]float64{}
		}
		parts[part] = pick(func(r Result) float64 { return r.CPUParts[part] })
	}
	return Result{Target: name, Conc: rs[0].Conc, CPUParts: parts,
		ReqPerSec:   pick(func(r Result) float64 { return r.ReqPerSec }),
		ItemsPerSec: pick(func(r Result) float64 { return r.ItemsPerSec }),
		MBPerSec:    pick(func(r Result) float64 { return r.MBPerSec }),
		P50us:       pick(func(r Result) float64 { return r.P50us }),
		P99us:       pick(func(r Result) float64 { return r.P99us }),
		CPUusPerReq: pick(func(r Result) float64 { return r.CPUusPerReq }),
	}
}

// WriteFixed writes n items of exactly size bytes and returns their keys.
func WriteFixed(dir string, n, size int) ([]string, error) {
	os.RemoveAll(dir)
	r := rand.New(rand.NewPCG(7, 7))
	buf := make([]byte, size)
	var keys []string
	for i := range n {
		key := fmt.Sprintf("class%02d/img_%06d.jpg", i%20, i)
		if err := os.MkdirAll(filepath.Join(dir, filepath.Dir(key)), 0o755); err != nil {
			return nil, err
		}
		for j := 0; j < size; j += 8 {
			v := r.Uint64()
			for k := 0; k < 8 && j+k < size; k++ {
				buf[j+k] = byte(v >> (8 * k))
			}
		}
		if err := os.WriteFile(filepath.Join(dir, key), buf, 0o644); err != nil {
			return nil, err
		}
		keys = append(keys, key)
	}
	slices.Sort(keys)
	return keys, nil
}

func machine() string {
	b, _ := os.ReadFile("/proc/cpuinfo")
	model := ""
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "model name"); ok {
			model = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
			break
		}
	}
	m, _ := os.ReadFile("/proc/meminfo")
	memLine := strings.SplitN(string(m), "\n", 2)[0]
	return fmt.Sprintf("%d cores, %s, %s, %s", runtime.NumCPU(), model, strings.Join(strings.Fields(memLine), " "), runtime.Version())
}

// NodeMemResult is a cachenode's memory with target bytes cached, after
// a warm-up and some seconds of random GETs.
type NodeMemResult struct {
	CachedBytes uint64  `json:"cached_bytes"`
	RSS         uint64  `json:"rss"`
	HeapBytes   uint64  `json:"heap_bytes"`
	RSSRatio    float64 `json:"rss_per_cached"`
	GCPauseMax  float64 `json:"gc_pause_max_us"` // over the node's life, warm-up included
	GCs         uint64  `json:"gcs"`
	// During the load: GC pauses and the upper bound of the histogram bucket
	// holding their 99th percentile (Go's buckets are coarse: ~82 µs, ~917 µs, ~10 ms).
	LoadGCs      uint64  `json:"load_gc_pauses"`
	LoadPauseP99 float64 `json:"load_gc_pause_p99_le_us"`
	ReqPerSec    float64 `json:"load_req_per_s"`
}

// nodeMemory fills a real node with target bytes of items of the configured
// size, loads it, and reads its RSS, heap and GC figures.
func nodeMemory(c *Config, target uint64) (*NodeMemResult, error) {
	n := int(target / uint64(c.Size))
	dir := filepath.Join(c.Work, "data-mem")
	keys, err := WriteFixed(dir, n, c.Size)
	if err != nil {
		return nil, err
	}
	c.logf("memory: %d items in %s", n, dir)
	mem := fmt.Sprintf("%dMiB", (uint64(n)*uint64(c.Size+4096)>>20)+64)
	nd, err := startNode(c.Work, filepath.Join(c.Bin, "cachenode"), "m", mem, "")
	if err != nil {
		return nil, err
	}
	defer nd.stop()
	if err := register(nd, "mem", dir); err != nil {
		return nil, err
	}
	if err := warm([]*nodeProc{nd}, "mem"); err != nil {
		return nil, err
	}
	paths := make([]string, len(keys))
	for i, k := range keys {
		paths[i] = "/v1/datasets/mem/items/" + k
	}
	before := pauseBuckets(nd)
	load, err := Run(HTTPGet("node-memory", nd.http, nd.pids, paths, ""), 16, 5*time.Second)
	if err != nil {
		return nil, err
	}
	st, err := nd.c.Stats(context.Background())
	if err != nil {
		return nil, err
	}
	res := &NodeMemResult{CachedBytes: st.BytesCached, RSS: rssOf(nd.cmd.Process.Pid), ReqPerSec: load.ReqPerSec}
	res.RSSRatio = float64(res.RSS) / float64(max(res.CachedBytes, 1))
	resp, err := nd.c.Do(context.Background(), "GET", "/metrics", nil)
	if err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		res.HeapBytes = uint64(metric(b, "go_memstats_heap_alloc_bytes"))
		res.GCPauseMax = metric(b, `go_gc_duration_seconds{quantile="1"}`) * 1e6
		res.GCs = uint64(metric(b, "go_gc_duration_seconds_count"))
	}
	res.LoadGCs, res.LoadPauseP99 = pauseP99(before, pauseBuckets(nd))
	os.RemoveAll(dir)
	c.logf("node with %d MiB cached: RSS %.3fx, heap %d MiB, %d GCs, max pause %.0fµs; under load %.0f req/s, %d pauses, p99 ≤ %.0fµs",
		res.CachedBytes>>20, res.RSSRatio, res.HeapBytes>>20, res.GCs, res.GCPauseMax, res.ReqPerSec, res.LoadGCs, res.LoadPauseP99)
	return res, nil
}

func metric(text []byte, name string) float64 {
	for _, line := range strings.Split(string(text), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			var v float64
			fmt.Sscan(rest, &v)
			return v
		}
	}
	return 0
}

type bucket struct {
	le    float64
	count float64
}

// pauseBuckets reads the node's cumulative GC pause histogram.
func pauseBuckets(n *nodeProc) []bucket {
	resp, err := n.c.Do(context.Background(), "GET", "/metrics", nil)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var out []bucket
	const prefix = `go_sched_pauses_total_gc_seconds_bucket{le="`
	for _, line := range strings.Split(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, prefix)
		if !ok {
			continue
		}
		le, val, _ := strings.Cut(rest, `"} `)
		var bk bucket
		if le == "+Inf" {
			bk.le = math.Inf(1)
		} else {
			fmt.Sscan(le, &bk.le)
		}
		fmt.Sscan(val, &bk.count)
		out = append(out, bk)
	}
	return out
}

// pauseP99 returns the pauses between two readings and the bucket bound
// (µs) under which 99% of them fall.
func pauseP99(a, b []bucket) (uint64, float64) {
	if len(a) != len(b) || len(b) == 0 {
		return 0, 0
	}
	total := b[len(b)-1].count - a[len(a)-1].count
	if total <= 0 {
		return 0, 0
	}
	for i := range b {
		if b[i].count-a[i].count >= 0.99*total {
			return uint64(total), b[i].le * 1e6
		}
	}
	return uint64(total), math.Inf(1)
}
