package split

import (
	"sync"
	"time"
)

// Meter measures each dataset's storage throughput as this node sees it:
// bytes read over the time at least one read was in flight. Reads overlap
// (a loader's misses, read-ahead), so summing each read's own duration
// would undercount the throughput by the overlap; busy time does not, and
// for throttled or bandwidth-bound storage it gives the bandwidth itself.
// Safe for concurrent use.
type Meter struct {
	mu  sync.Mutex
	ds  map[uint32]*busy
	now func() time.Time
}

type busy struct {
	inflight int
	since    time.Time
	busy     time.Duration
	bytes    uint64
}

// NewMeter returns a meter on the wall clock.
func NewMeter() *Meter { return &Meter{ds: map[uint32]*busy{}, now: time.Now} }

func (m *Meter) get(id uint32) *busy {
	b := m.ds[id]
	if b == nil {
		b = &busy{}
		m.ds[id] = b
	}
	return b
}

// Start marks a storage read of dataset id as begun.
func (m *Meter) Start(id uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.get(id)
	if b.inflight == 0 {
		b.since = m.now()
	}
	b.inflight++
}

// Done marks it ended, having read n bytes (0 when it failed).
func (m *Meter) Done(id uint32, n int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b := m.get(id)
	b.inflight--
	b.bytes += uint64(n)
	if b.inflight == 0 {
		b.busy += m.now().Sub(b.since)
	}
}

// Read returns the bytes dataset id has read from storage and the time
// reads were in flight, the current busy spell included.
func (m *Meter) Read(id uint32) (bytes uint64, busy time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.ds[id]
	if !ok {
		return 0, 0
	}
	busy = b.busy
	if b.inflight > 0 {
		busy += m.now().Sub(b.since)
	}
	return b.bytes, busy
}

// Rate is dataset id's storage throughput in bytes per second, 0 when
// nothing was read yet.
func (m *Meter) Rate(id uint32) float64 {
	bytes, busy := m.Read(id)
	if busy <= 0 || bytes == 0 {
		return 0
	}
	return float64(bytes) / busy.Seconds()
}

// Forget drops dataset id's figures (it was deleted).
func (m *Meter) Forget(id uint32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.ds, id)
}
