package transport

import (
	"math/bits"
	"sync"
)

// Payload buffers come in power-of-two classes from 4 KiB to 4 MiB; larger
// payloads (batches) are allocated and left to the collector.
const (
	minClassShift = 12
	maxClassShift = 22
)

// bufPool recycles the buffers that single-item responses are read into.
// A fresh 110 KiB buffer is zeroed by the runtime and lands in memory that
// left the CPU caches long ago (the node's heap headroom is large); a peer hit
// profile spent 7% of all CPU clearing them.
type bufPool struct {
	classes [maxClassShift - minClassShift + 1]sync.Pool
}

type payloadBuf struct{ b []byte }

func classOf(size int) (int, bool) {
	if size <= 1<<minClassShift {
		return 0, true
	}
	shift := bits.Len(uint(size - 1))
	return shift - minClassShift, shift <= maxClassShift
}

// get returns a buffer of length n, recycled when one of its class is free.
func (p *bufPool) get(n int) *payloadBuf {
	c, ok := classOf(n)
	if !ok {
		return &payloadBuf{b: make([]byte, n)}
	}
	if pb, _ := p.classes[c].Get().(*payloadBuf); pb != nil {
		pb.b = pb.b[:n]
		return pb
	}
	return &payloadBuf{b: make([]byte, n, 1<<(c+minClassShift))}
}

// put takes a buffer back; nothing may use its bytes afterwards.
func (p *bufPool) put(pb *payloadBuf) {
	c, ok := classOf(cap(pb.b))
	if !ok || cap(pb.b) != 1<<(c+minClassShift) {
		return
	}
	p.classes[c].Put(pb)
}
