// Package bufpool recycles the item-sized buffers a node reads peers' answers
// and storage objects into, so that serving a miss neither allocates nor
// zeroes a fresh buffer.
package bufpool

import (
	"math/bits"
	"sync"
)

// Buffers come in power-of-two classes from 4 KiB to 4 MiB; larger ones
// (batches) are allocated and left to the collector.
const (
	minClassShift = 12
	maxClassShift = 22
)

// Pool recycles item-sized buffers: the ones peer fetches and storage reads
// are read into. A fresh 110 KiB buffer is zeroed by the runtime and lands in
// memory that left the CPU caches long ago (the node's heap headroom is
// large); a peer hit profile spent 7% of all CPU clearing them, and warming
// up 1.1 GiB ran 7 collections for them (none with the pool). The zero value
// is ready to use.
type Pool struct {
	classes [maxClassShift - minClassShift + 1]sync.Pool
}

// Buf is a buffer from a Pool; B is its bytes.
type Buf struct{ B []byte }

func classOf(size int) (int, bool) {
	if size <= 1<<minClassShift {
		return 0, true
	}
	shift := bits.Len(uint(size - 1))
	return shift - minClassShift, shift <= maxClassShift
}

// Get returns a buffer of length n, recycled when one of its class is free.
func (p *Pool) Get(n int) *Buf {
	c, ok := classOf(n)
	if !ok {
		return &Buf{B: make([]byte, n)}
	}
	if pb, _ := p.classes[c].Get().(*Buf); pb != nil {
		pb.B = pb.B[:n]
		return pb
	}
	return &Buf{B: make([]byte, n, 1<<(c+minClassShift))}
}

// Put takes a buffer back; nothing may use its bytes afterwards.
func (p *Pool) Put(pb *Buf) {
	c, ok := classOf(cap(pb.B))
	if !ok || cap(pb.B) != 1<<(c+minClassShift) {
		return
	}
	p.classes[c].Put(pb)
}
