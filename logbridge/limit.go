package logbridge

import (
	"sync"
	"time"
)

// Limiter keeps a log line that a remote party can cause at will (a
// connection refused for a bad key, a malformed gossip packet) to one per
// interval: each refused attempt logged a line, and a loop of them from
// one client wrote about 2 MB of log a second per port.
type Limiter struct {
	every time.Duration
	now   func() time.Time

	mu      sync.Mutex
	last    time.Time
	dropped int
}

// NewLimiter returns a Limiter that lets one line through per every.
func NewLimiter(every time.Duration) *Limiter {
	return &Limiter{every: every, now: time.Now}
}

// Allow reports whether to write the line now, and how many lines were
// left out since the last one written (to say so in this one).
func (l *Limiter) Allow() (ok bool, leftOut int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if !l.last.IsZero() && now.Sub(l.last) < l.every {
		l.dropped++
		return false, 0
	}
	l.last, leftOut, l.dropped = now, l.dropped, 0
	return true, leftOut
}

// RefusalsEvery is how often a line about a refused remote is written.
const RefusalsEvery = 10 * time.Second
