package bufpool

import "testing"

func TestPayloadClasses(t *testing.T) {
	for _, tc := range []struct {
		size, class int
		ok          bool
	}{{1, 0, true}, {4096, 0, true}, {4097, 1, true}, {110 << 10, 5, true}, {128 << 10, 5, true}, {4 << 20, 10, true}, {4<<20 + 1, 0, false}} {
		c, ok := classOf(tc.size, defaultClassShift)
		if ok != tc.ok || (ok && c != tc.class) {
			t.Errorf("classOf(%d) = %d, %v; want %d, %v", tc.size, c, ok, tc.class, tc.ok)
		}
	}
	var p Pool
	big := p.Get(4<<20 + 1)
	if len(big.B) != 4<<20+1 {
		t.Fatalf("len %d", len(big.B))
	}
	p.Put(big) // dropped: no class holds it
	if got := p.Get(4<<20 + 1); got == big {
		t.Fatal("an unpooled size came back from the pool")
	}
}

// A pool with a larger Max recycles buffers up to it, and no larger; Max
// rounds up to its class and stops at 256 MiB.
func TestLargerMax(t *testing.T) {
	p := Pool{Max: 12 << 20}
	if got := p.maxShift(); got != 24 {
		t.Fatalf("Max 12 MiB: largest class 1<<%d, want 1<<24", got)
	}
	if got := (&Pool{Max: 1 << 40}).maxShift(); got != maxClassShift {
		t.Fatalf("Max 1 TiB: largest class 1<<%d, want 1<<%d", got, maxClassShift)
	}
	body := p.Get(12<<20 + 5)
	if len(body.B) != 12<<20+5 || cap(body.B) != 16<<20 || p.Held(12<<20+5) != 16<<20 {
		t.Fatalf("len %d cap %d, held %d", len(body.B), cap(body.B), p.Held(12<<20+5))
	}
	if got := p.Held(16<<20 + 1); got != 16<<20+1 {
		t.Fatalf("past the largest class, a buffer holds %d bytes for 16 MiB + 1", got)
	}
	reused := false
	for range 100 { // sync.Pool may drop what it is given
		p.Put(body)
		if next := p.Get(9 << 20); next == body {
			reused = len(next.B) == 9<<20
			break
		}
	}
	if !reused {
		t.Fatal("a 16 MiB buffer was not reused by a pool whose Max allows it")
	}
	over := p.Get(16<<20 + 1)
	p.Put(over)
	for range 100 {
		if p.Get(16<<20+1) == over {
			t.Fatal("a buffer past Max's class came back from the pool")
		}
	}
}

func TestRecycledBufferIsReused(t *testing.T) {
	var p Pool
	first := p.Get(110 << 10)
	if len(first.B) != 110<<10 || cap(first.B) != 128<<10 {
		t.Fatalf("len %d cap %d", len(first.B), cap(first.B))
	}
	// sync.Pool may drop what it is given (always possible, and on purpose
	// under -race), so give it several chances.
	for range 100 {
		p.Put(first)
		if next := p.Get(100 << 10); next == first {
			if len(next.B) != 100<<10 {
				t.Fatalf("reused buffer has len %d", len(next.B))
			}
			return
		}
	}
	t.Fatal("a recycled buffer was never handed out again")
}
