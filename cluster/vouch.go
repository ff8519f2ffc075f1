package cluster

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// A member that gossip declares dead is often still running: a host starved
// of CPU (preprocessing, a collection, 32 nodes on 2 cores in the testbed)
// misses its probes, and its refutation arrives after the suspicion timer.
// Every ring change moves 1/n of the items, and such a flap changes the ring
// twice (out, then back in), each new owner refilling its share. So before
// the ring drops a member, it asks the member directly: a member whose peer
// transport completes a handshake stays on the ring, and is asked again
// every interval, until gossip sees it alive again or max has passed. A
// crashed member refuses the connection and leaves the ring at once. A ping
// that merely times out is weaker evidence: the starved host that gossip
// gave up on is slow to accept too, and one lost SYN outlasts a short ping
// (300 ms with fast timers). So only patience timeouts in a row drop a
// member: one cut off leaves the ring after patience pings.
type voucher struct {
	ping                   func(ctx context.Context, addr string) error
	timeout, interval, max time.Duration
	patience               int    // pings in a row that time out before a member is dropped
	kick                   func() // a verdict came in: rebuild the ring
	log                    *slog.Logger

	ctx    context.Context // ends the pings when the node leaves
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	held   map[string]*hold
	closed bool
	// vouched counts the holds begun on a member that answered.
	vouched atomic.Uint64
}

// newVoucher asks members with ping, each ping within timeout, again every
// interval, holding none longer than max; kick is called when a verdict
// drops a member.
func newVoucher(ping func(ctx context.Context, addr string) error, timeout, interval, max time.Duration, kick func(), log *slog.Logger) *voucher {
	v := &voucher{ping: ping, timeout: timeout, interval: interval, max: max, patience: 3, kick: kick, log: log, held: map[string]*hold{}}
	v.ctx, v.cancel = context.WithCancel(context.Background())
	return v
}

type hold struct {
	since time.Time
	// gone: the member refused a ping, timed out patience times in a row, or
	// max passed. Until then it stays, while the first ping is under way too.
	gone bool
}

// keep reports whether member name, which gossip has declared dead and which
// is on the current ring, stays on it for now. The first call starts asking
// the member at addr; the answer comes back through kick.
func (v *voucher) keep(name, addr string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	h, ok := v.held[name]
	if !ok {
		if addr == "" || v.closed {
			return false
		}
		h = &hold{since: time.Now()}
		v.held[name] = h
		v.wg.Add(1)
		go v.ask(name, addr, h)
	}
	return !h.gone
}

// close stops the pings under way and waits for them.
func (v *voucher) close() {
	v.mu.Lock()
	v.closed = true
	v.mu.Unlock()
	v.cancel()
	v.wg.Wait()
}

// prune forgets the holds of members no longer dead on the ring (alive
// again, left, or dropped), so a later death is asked about afresh.
func (v *voucher) prune(deadOnRing map[string]bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	for name := range v.held {
		if !deadOnRing[name] {
			delete(v.held, name)
		}
	}
}

// ask pings a held member until it refuses, times out patience times in a
// row, max passes, or the hold is forgotten.
func (v *voucher) ask(name, addr string, h *hold) {
	defer v.wg.Done()
	answered, misses := false, 0
	for {
		ctx, cancel := context.WithTimeout(v.ctx, v.timeout)
		err := v.ping(ctx, addr)
		cancel()
		v.mu.Lock()
		if v.held[name] != h || v.closed {
			v.mu.Unlock()
			return
		}
		if err != nil {
			misses++
		} else {
			misses = 0
		}
		expired := time.Since(h.since) >= v.max
		gone := expired || (err != nil && (refused(err) || misses >= v.patience))
		h.gone = gone
		v.mu.Unlock()
		switch {
		case err != nil && gone:
			v.log.Info("member declared dead does not answer; dropping it from the ring", "member", name, "err", err)
		case err != nil:
			v.log.Info("member declared dead did not answer in time; asking again", "member", name, "err", err, "misses", misses)
		case expired:
			v.log.Warn("member declared dead still answers, but gossip has not seen it for too long; dropping it from the ring",
				"member", name, "held", v.max)
		case !answered:
			answered = true
			v.vouched.Add(1)
			v.log.Info("member declared dead still answers; keeping it on the ring", "member", name)
		}
		if gone {
			v.kick()
			return
		}
		select {
		case <-v.ctx.Done():
			return
		case <-time.After(v.interval):
		}
	}
}

// refused reports whether a ping's failure says nobody listens at the
// member's address (a crashed process on a live host), as opposed to an
// answer that did not come in time.
func refused(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET)
}
