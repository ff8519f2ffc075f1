package bench

import (
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/cespare/xxhash/v2"

	"stallfree/store"
)

// MemResult is the store's memory use at a fill level, and GC pauses while
// items churn under request garbage.
type MemResult struct {
	ItemSize    int     `json:"item_size"`
	Items       int     `json:"items"`
	CachedBytes uint64  `json:"cached_bytes"`
	RSS         uint64  `json:"rss"`
	Heap        uint64  `json:"heap"`
	RSSRatio    float64 `json:"rss_per_cached"`
	GCs         uint32  `json:"gcs_during_churn"`
	PauseP99us  float64 `json:"gc_pause_p99_us"`
	PauseMaxus  float64 `json:"gc_pause_max_us"`
}

// Memory fills a store with target bytes of size-byte items, as the node
// does (same memory limit), measures RSS and heap, then churns: replaces
// items (LRU evicting) while allocating request-sized garbage, and reads the
// GC pause distribution. It runs in this process, so the figure is the
// store's own cost plus a Go runtime.
func Memory(size int, target uint64, churn time.Duration) (MemResult, error) {
	runtime.GC()
	debug.FreeOSMemory()
	base := rssOf(selfPID())
	capacity := target + target/32
	// What cachenode sets (cmd/cachenode setGC).
	debug.SetGCPercent(-1)
	debug.SetMemoryLimit(int64(128<<20 + capacity/32))
	defer debug.SetGCPercent(100)
	defer debug.SetMemoryLimit(math.MaxInt64)
	s, err := store.New(capacity, store.NewLRU())
	if err != nil {
		return MemResult{}, err
	}
	defer s.Close()
	buf := make([]byte, size)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range buf {
		buf[i] = byte(r.Uint32())
	}
	n := int(target / uint64(size))
	for i := range n {
		buf[0], buf[1], buf[2], buf[3] = byte(i), byte(i>>8), byte(i>>16), byte(i>>24)
		if err := s.Put(store.MakeKey(1, uint32(i)), buf, xxhash.Sum64(buf)); err != nil {
			return MemResult{}, fmt.Errorf("fill item %d: %w", i, err)
		}
	}
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	st := s.Stats()
	res := MemResult{ItemSize: size, Items: st.Items, CachedBytes: st.Bytes, RSS: rssOf(selfPID()) - base, Heap: ms.HeapAlloc}
	res.RSSRatio = float64(res.RSS) / float64(res.CachedBytes)

	// Churn: new items evict old ones; every operation also allocates a
	// request's worth of garbage, as an HTTP server does.
	before := pauses()
	gc0 := ms.NumGC
	var sink []byte
	start := time.Now()
	for i := n; time.Since(start) < churn; i++ {
		buf[0], buf[1], buf[2], buf[3] = byte(i), byte(i>>8), byte(i>>16), byte(i>>24)
		s.Put(store.MakeKey(1, uint32(i)), buf, xxhash.Sum64(buf))
		if ref, ok := s.Get(store.MakeKey(1, uint32(i-n/2))); ok {
			ref.Release()
		}
		sink = make([]byte, 4096+size/8)
		sink[0] = byte(i)
	}
	_ = sink
	runtime.ReadMemStats(&ms)
	res.GCs = ms.NumGC - gc0
	res.PauseP99us, res.PauseMaxus = pauseQuantiles(before, pauses())
	return res, nil
}

func pauses() *metrics.Float64Histogram {
	s := []metrics.Sample{{Name: "/sched/pauses/total/gc:seconds"}}
	metrics.Read(s)
	return s[0].Value.Float64Histogram()
}

// pauseQuantiles returns p99 and max of the pauses recorded between a and b.
func pauseQuantiles(a, b *metrics.Float64Histogram) (float64, float64) {
	var total uint64
	counts := make([]uint64, len(b.Counts))
	for i := range b.Counts {
		counts[i] = b.Counts[i] - a.Counts[i]
		total += counts[i]
	}
	if total == 0 {
		return 0, 0
	}
	var seen uint64
	p99, mx := 0.0, 0.0
	for i, c := range counts {
		if c == 0 {
			continue
		}
		seen += c
		upper := b.Buckets[i+1]
		if upper > 1e9 {
			upper = b.Buckets[i]
		}
		if p99 == 0 && float64(seen) >= 0.99*float64(total) {
			p99 = upper * 1e6
		}
		mx = upper * 1e6
	}
	return p99, mx
}
