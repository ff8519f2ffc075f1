package bufpool

import "testing"

func TestPayloadClasses(t *testing.T) {
	for _, tc := range []struct {
		size, class int
		ok          bool
	}{{1, 0, true}, {4096, 0, true}, {4097, 1, true}, {110 << 10, 5, true}, {128 << 10, 5, true}, {4 << 20, 10, true}, {4<<20 + 1, 0, false}} {
		c, ok := classOf(tc.size)
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
