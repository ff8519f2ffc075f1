package derived

import (
	"fmt"
	"sync/atomic"
	"testing"

	"stallfree/internal/testcatalog"
	"stallfree/internal/testutil"
	"stallfree/relay"
	"stallfree/source"
	"stallfree/store"
)

// BenchmarkParallelWrites writes b.N prep-cache items of 192 KiB (a
// 256×256×3 array), each once, from GOMAXPROCS goroutines: the node's side
// of a first epoch whose loaders write several minibatches at once. Each
// write sums its item and copies it into memory touched for the first time.
//
//	go test -run '^$' -bench ParallelWrites -benchtime 3000x ./derived
func BenchmarkParallelWrites(b *testing.B) {
	const size = 256 * 256 * 3
	cat := testcatalog.Leader(b, "self")
	pol, _ := store.NewPolicy("minio")
	st, err := store.New(uint64(b.N)*(size+4096)+1<<20, pol)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	entries := make([]source.Entry, b.N)
	for i := range entries {
		entries[i] = source.Entry{Key: fmt.Sprintf("k%07d", i), Size: size}
	}
	if _, _, err := cat.RegisterDataset("parent", "dir:///nowhere", entries, 0); err != nil {
		b.Fatal(err)
	}
	h := &fakeHost{cat: cat, owner: "self", addrs: map[string]string{}, members: []string{"self"}}
	p := New(Config{Name: "self", Relay: relay.New("self", ""), Logger: testutil.Discard()}, cat, st, h)
	if _, _, err := p.Derive(b.Context(), "dec", "parent", "bench"); err != nil {
		b.Fatal(err)
	}
	d, _ := cat.Dataset("dec")
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 7)
	}
	var next atomic.Int64
	b.SetBytes(size)
	b.ResetTimer()
	cpu0 := testutil.ProcessCPU(b)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if created, err := p.Write(d, int(next.Add(1)-1), data); err != nil || !created {
				b.Errorf("write: created %v, %v", created, err)
				return
			}
		}
	})
	b.ReportMetric(float64((testutil.ProcessCPU(b)-cpu0).Microseconds())/1e3/float64(b.N), "cpu-ms/op")
}
