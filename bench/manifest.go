package bench

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ManifestResult is what registering a large directory dataset costs the
// nodes: time, and memory per item (RSS growth once settled, and the peak).
type ManifestResult struct {
	Items   int     `json:"items"`
	Nodes   int     `json:"nodes"`
	KeyLen  float64 `json:"mean_key_bytes"`
	Seconds float64 `json:"register_seconds"`
	// Per node, in node order: the first registered the dataset.
	PerItem     []float64 `json:"rss_bytes_per_item"`      // settled RSS growth / items
	AnonPerItem []float64 `json:"anon_rss_bytes_per_item"` // the anonymous part (heap) of it
	PeakPerItem []float64 `json:"peak_rss_bytes_per_item"` // peak RSS during registration − RSS before / items
	RaftBytes   []int64   `json:"raft_dir_bytes"`          // the data directory's size afterwards
	// RSS growth / items 10 s after the registration, with no debug call:
	// what a user sees (goal ≤ 64 B).
	PerItem10s []float64 `json:"rss_bytes_per_item_10s"`
}

// manifestKey is item i's key in an ImageNet-shaped tree: 1000 items a class
// directory, class and file names as in ImageNet's train split.
func manifestKey(i int) string {
	class := i / 1000
	return fmt.Sprintf("train/n%08d/n%08d_%d.JPEG", 1440764+class, 1440764+class, 10000+i%1000*7)
}

// manifestSize is item i's size: 16–240 KiB, spread as JPEGs are.
func manifestSize(i int) int64 { return int64(16<<10 + (uint64(i)*2654435761)%(224<<10)) }

// WriteSparseTree creates items files of ImageNet-shaped names under dir,
// each a sparse file of its size (no blocks), once: a finished tree is
// marked and reused, as writing 10 M files takes minutes.
func WriteSparseTree(dir string, items int) error {
	done := dir + ".complete" // beside the tree: inside it, it would be an item
	if b, err := os.ReadFile(done); err == nil && string(b) == strconv.Itoa(items) {
		return nil
	}
	if err := os.RemoveAll(dir); err != nil {
		return err
	}
	classes := (items + 999) / 1000
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	next := make(chan int)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for class := range next {
				if err := writeClass(dir, class, min(items, (class+1)*1000)); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	var err error
	for class := 0; class < classes; class++ {
		select {
		case next <- class:
			continue
		case err = <-errs:
		}
		break
	}
	close(next)
	wg.Wait()
	if err == nil {
		select {
		case err = <-errs:
		default:
		}
	}
	if err != nil {
		return err
	}
	return os.WriteFile(done, []byte(strconv.Itoa(items)), 0o644)
}

func writeClass(dir string, class, end int) error {
	first := class * 1000
	sub := filepath.Join(dir, filepath.Dir(manifestKey(first)))
	if err := os.MkdirAll(sub, 0o755); err != nil {
		return err
	}
	for i := first; i < end; i++ {
		f, err := os.Create(filepath.Join(dir, manifestKey(i)))
		if err != nil {
			return err
		}
		err = f.Truncate(manifestSize(i))
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// Manifest registers a directory of items files on 2 nodes and measures the
// time and each node's memory per item.
func Manifest(c *Config, items int) (*ManifestResult, error) {
	dir := filepath.Join(c.Work, fmt.Sprintf("manifest-%d", items))
	start := time.Now()
	if err := WriteSparseTree(dir, items); err != nil {
		return nil, fmt.Errorf("writing %d files: %w", items, err)
	}
	c.logf("manifest: %d files ready in %s", items, time.Since(start).Round(time.Second))
	// Default raft timers, as a deployment runs: the fast ones are for
	// loopback tests, and a leader busy applying 10 M entries misses them.
	// The debug listener (profiling on) is how the nodes are asked to
	// collect at the end.
	profiled := *c
	profiled.Profile = true
	cl, err := startCluster(&profiled, "manifest", 2, "1GiB", nil, "--timing", "lan")
	defer cl.stop()
	if err != nil {
		return nil, err
	}
	pids := cl.pids()
	before := make([]procMem, len(pids))
	for i, pid := range pids {
		if err := freeMemory(cl[i].debug); err != nil {
			return nil, err
		}
		before[i] = memOf(pid)
	}
	// The peak is sampled while the registration runs: VmHWM also counts the
	// start-up, which is not the dataset's.
	peak := make([]uint64, len(pids))
	stop, sampled := make(chan struct{}), make(chan struct{})
	stopSampling := func() { close(stop); <-sampled }
	go func() {
		defer close(sampled)
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			for i, pid := range pids {
				peak[i] = max(peak[i], memOf(pid).rss)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	res := &ManifestResult{Items: items, Nodes: len(cl)}
	start = time.Now()
	err = register(cl[0], "big", dir)
	registered := time.Now()
	res.Seconds = registered.Sub(start).Seconds()
	if err != nil {
		err = fmt.Errorf("registering %d files: %w", items, err)
	} else {
		// Registered means committed; the other node applies it a moment later.
		err = awaitDataset(cl[1], "big", items)
	}
	stopSampling()
	if err != nil {
		return nil, err
	}
	// What a user sees: RSS 10 s after the registration, nothing forced.
	time.Sleep(10*time.Second - time.Since(registered))
	for i, pid := range pids {
		res.PerItem10s = append(res.PerItem10s, (float64(memOf(pid).rss)-float64(before[i].rss))/float64(items))
	}
	// Settled: the garbage the registration left (the listing, decoded
	// chunks) is collected and its memory handed back, as the collector
	// would once it reached its headroom.
	for _, n := range cl {
		if err := freeMemory(n.debug); err != nil {
			return nil, err
		}
	}
	var keyBytes int
	for i := range items {
		keyBytes += len(manifestKey(i))
	}
	res.KeyLen = float64(keyBytes) / float64(items)
	for i, pid := range pids {
		after := memOf(pid)
		res.PerItem = append(res.PerItem, (float64(after.rss)-float64(before[i].rss))/float64(items))
		res.AnonPerItem = append(res.AnonPerItem, (float64(after.anon)-float64(before[i].anon))/float64(items))
		res.PeakPerItem = append(res.PeakPerItem, (float64(peak[i])-float64(before[i].rss))/float64(items))
		res.RaftBytes = append(res.RaftBytes, dirSize(filepath.Join(c.Work, "state-"+cl[i].name)))
	}
	return res, nil
}

func freeMemory(debugAddr string) error {
	resp, err := http.Post("http://"+debugAddr+"/debug/free-memory", "", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("free-memory on %s: %s", debugAddr, resp.Status)
	}
	return nil
}

func awaitDataset(n *nodeProc, name string, items int) error {
	deadline := time.Now().Add(60 * time.Second)
	for {
		d, err := n.c.Dataset(context.Background(), name)
		if err == nil && d.Items == items {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("%d items of %d", d.Items, items)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s never showed dataset %s: %w", n.name, name, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// procMem is a process's resident memory, whole and its anonymous part.
type procMem struct{ rss, anon uint64 }

func memOf(pid int) procMem {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procMem{}
	}
	var m procMem
	for _, line := range strings.Split(string(b), "\n") {
		field, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch field {
		case "VmRSS":
			m.rss = kb << 10
		case "RssAnon":
			m.anon = kb << 10
		}
	}
	return m
}

func dirSize(dir string) int64 {
	var n int64
	_ = filepath.Walk(dir, func(_ string, fi os.FileInfo, err error) error {
		if err != nil {
			return nil // what cannot be read counts as nothing
		}
		if fi.Mode().IsRegular() {
			n += fi.Size()
		}
		return nil
	})
	return n
}
