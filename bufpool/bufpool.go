// Package bufpool recycles the item-sized buffers a node reads peers' answers
// and storage objects into, so that serving a miss neither allocates nor
// zeroes a fresh buffer.
package bufpool

import (
	"math/bits"
	"sync"
)

// Buffers come in power-of-two classes from 4 KiB to 4 MiB; larger ones
// (batches) are allocated and left to the collector, unless a Pool's Max
// allows classes up to 256 MiB.
const (
	minClassShift     = 12
	defaultClassShift = 22
	maxClassShift     = 28
)

// Pool recycles item-sized buffers: the ones peer fetches and storage reads
// are read into. A fresh 110 KiB buffer is zeroed by the runtime and lands in
// memory that left the CPU caches long ago (the node's heap headroom is
// large); a peer hit profile spent 7% of all CPU clearing them, and warming
// up 1.1 GiB ran 7 collections for them (none with the pool). The zero value
// is ready to use.
type Pool struct {
	// Max is the largest buffer recycled (0: 4 MiB; at most 256 MiB). Set
	// it before the first Get. Only a user that never holds a buffer past
	// its Put raises it: larger buffers are batches, and their users'
	// slices of them live longer than an item's.
	Max     int
	classes [maxClassShift - minClassShift + 1]sync.Pool
}

// Buf is a buffer from a Pool; B is its bytes.
type Buf struct{ B []byte }

// classOf is the class of a buffer of size bytes, and whether a pool
// whose largest class is 1<<maxShift has it.
func classOf(size, maxShift int) (int, bool) {
	if size <= 1<<minClassShift {
		return 0, true
	}
	shift := bits.Len(uint(size - 1))
	return shift - minClassShift, shift <= maxShift
}

// maxShift is the shift of p's largest class.
func (p *Pool) maxShift() int {
	if p.Max <= 0 {
		return defaultClassShift
	}
	return min(bits.Len(uint(p.Max-1)), maxClassShift)
}

// Get returns a buffer of length n, recycled when one of its class is free.
func (p *Pool) Get(n int) *Buf {
	c, ok := classOf(n, p.maxShift())
	if !ok {
		return &Buf{B: make([]byte, n)}
	}
	if pb, _ := p.classes[c].Get().(*Buf); pb != nil {
		pb.B = pb.B[:n]
		return pb
	}
	return &Buf{B: make([]byte, n, 1<<(c+minClassShift))}
}

// Held is the capacity Get(n) returns: the memory a buffer of n bytes
// holds (its class's size, or n where no class has it).
func (p *Pool) Held(n int) int {
	c, ok := classOf(n, p.maxShift())
	if !ok {
		return n
	}
	return 1 << (c + minClassShift)
}

// Put takes a buffer back; nothing may use its bytes afterwards.
func (p *Pool) Put(pb *Buf) {
	c, ok := classOf(cap(pb.B), p.maxShift())
	if !ok || cap(pb.B) != 1<<(c+minClassShift) {
		return
	}
	p.classes[c].Put(pb)
}
