package store

import (
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Populating ahead. A put copies its item into the arena under the store's
// lock, and on memory never touched before nearly all of that time is the
// kernel finding and zeroing pages (MADV_POPULATE_WRITE in prefault: 90% of
// a 192 KiB put's CPU on a fresh 2-core VM, BenchmarkParallelWrites in
// derived). Every other put and every read waits meanwhile. So while a
// fresh arena fills, one goroutine maps the pages just past the highest
// extent handed out, outside the lock, and the puts find them mapped. A
// fresh arena hands out extents from its start upward (best fit of one
// large free extent), and extents freed later are reused where pages are
// mapped already, so a frontier is all it needs to track. The pages cost
// about the same CPU; they are no longer paid for under the lock. At most
// aheadBytes, and no more than the budget's room, are mapped before a put
// asks for them. Should the kernel refuse (none before Linux 5.14, or
// memory short), the goroutine ends and the puts map their own pages, as
// before.

// aheadBytes is how far past the highest extent handed out the pages are
// mapped (never past the store's budget: the arena's slack, for items
// still being sent, is left unmapped until used); aheadChunk is one madvise
// call's share of that (a stop waits for at most one).
const (
	aheadBytes = 64 << 20
	aheadChunk = 2 << 20
)

type populator struct {
	mem    []byte        // the arena's first limit bytes; unmapped only after stop returns
	want   atomic.Uint64 // map pages up to here
	done   atomic.Uint64 // pages are mapped up to here, from the arena's start (a put's prefault may have mapped some already)
	wake   chan struct{} // one pending wake-up at most
	quit   chan struct{}
	exited chan struct{}
}

func newPopulator(mem []byte, limit uint64) *populator {
	mem = mem[:min(uint64(len(mem)), limit)]
	p := &populator{mem: mem, wake: make(chan struct{}, 1), quit: make(chan struct{}), exited: make(chan struct{})}
	go p.run()
	return p
}

// reached tells the populator that an extent ending at end was handed out,
// with room bytes of the budget left: it maps the pages up to
// end+min(aheadBytes, room). It never blocks.
func (p *populator) reached(end, room uint64) {
	target := min(alignPage(end+min(aheadBytes, room)), uint64(len(p.mem)))
	for {
		cur := p.want.Load()
		if target <= cur {
			return
		}
		if p.want.CompareAndSwap(cur, target) {
			break
		}
	}
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (p *populator) run() {
	defer close(p.exited)
	for {
		select {
		case <-p.quit:
			return
		case <-p.wake:
		}
		for {
			done, want := p.done.Load(), p.want.Load()
			if done >= want {
				break
			}
			end := min(want, done+aheadChunk)
			if err := unix.Madvise(p.mem[done:end], unix.MADV_POPULATE_WRITE); err != nil {
				// A kernel without it, or memory refused: the puts map
				// their own pages (prefault), as before.
				return
			}
			p.done.Store(end)
			select {
			case <-p.quit:
				return
			default:
			}
		}
	}
}

// stop ends the goroutine and waits for it: after it returns nothing
// touches the arena's memory.
func (p *populator) stop() {
	close(p.quit)
	<-p.exited
}
