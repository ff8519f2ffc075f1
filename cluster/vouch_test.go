package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"stallfree/internal/testutil"
)

// fakePeers answers pings for the addresses marked up, lets those marked
// hung time out, refuses the rest, and counts the pings.
type fakePeers struct {
	mu       sync.Mutex
	up, hung map[string]bool
	pings    atomic.Int64
}

func (f *fakePeers) ping(ctx context.Context, addr string) error {
	f.pings.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case f.hung[addr]:
		return fmt.Errorf("dial %s: %w", addr, context.DeadlineExceeded)
	case !f.up[addr]:
		return fmt.Errorf("dial %s: %w", addr, syscall.ECONNREFUSED)
	}
	return nil
}

func (f *fakePeers) setHung(addr string, hung bool) {
	f.mu.Lock()
	f.hung[addr] = hung
	f.mu.Unlock()
}

func (f *fakePeers) set(addr string, up bool) {
	f.mu.Lock()
	f.up[addr] = up
	f.mu.Unlock()
}

func testVoucher(t *testing.T, peers *fakePeers, max time.Duration) (*voucher, chan struct{}) {
	kicks := make(chan struct{}, 16)
	v := newVoucher(peers.ping, time.Second, 5*time.Millisecond, max, func() { kicks <- struct{}{} }, slog.New(slog.DiscardHandler))
	t.Cleanup(v.close)
	return v, kicks
}

func awaitKick(t *testing.T, kicks chan struct{}) {
	t.Helper()
	select {
	case <-kicks:
	case <-time.After(10 * time.Second):
		t.Fatal("no verdict came back")
	}
}

// A member declared dead that answers stays on the ring; one that refuses
// leaves it; both are asked, not assumed.
func TestVoucherKeepsOnlyMembersThatAnswer(t *testing.T) {
	peers := &fakePeers{up: map[string]bool{"a:1": true}, hung: map[string]bool{}}
	v, kicks := testVoucher(t, peers, time.Hour)
	if !v.keep("a", "a:1") || !v.keep("b", "b:1") {
		t.Fatal("a member is dropped before it was asked")
	}
	awaitKick(t, kicks) // b's refusal
	if v.keep("b", "b:1") {
		t.Fatal("a member that refused the ping is kept")
	}
	testutil.Await(t, "a vouch", func() bool { return v.vouched.Load() == 1 })
	if !v.keep("a", "a:1") {
		t.Fatal("a member that answered is dropped")
	}
	if got := v.vouched.Load(); got != 1 {
		t.Fatalf("vouched %d, want 1 (a, once however often it is asked)", got)
	}
	testutil.Await(t, "four pings", func() bool { return peers.pings.Load() >= 4 }) // a is asked again and again
	if v.keep("c", "") {
		t.Fatal("a member without a peer address is kept")
	}
	// a stops answering: it leaves the ring at the next ping.
	peers.set("a:1", false)
	awaitKick(t, kicks)
	if v.keep("a", "a:1") {
		t.Fatal("a member that stopped answering is kept")
	}
}

// A ping that times out is not a refusal: the member stays through
// patience-1 timeouts in a row, an answer starts the count afresh, and the
// patience-th timeout in a row drops it.
func TestVoucherTimeoutsDropOnlyInARow(t *testing.T) {
	asked, verdicts := make(chan struct{}), make(chan error)
	ping := func(ctx context.Context, _ string) error {
		select {
		case asked <- struct{}{}:
		case <-ctx.Done(): // closed mid-test
			return ctx.Err()
		}
		select {
		case err := <-verdicts:
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	kicks := make(chan struct{}, 16)
	v := newVoucher(ping, time.Second, time.Millisecond, time.Hour, func() { kicks <- struct{}{} }, slog.New(slog.DiscardHandler))
	t.Cleanup(v.close)
	timeout := fmt.Errorf("dial: %w", context.DeadlineExceeded)
	// The state a ping leaves is in place once the next ping is asked.
	answer := func(err error) {
		t.Helper()
		select {
		case <-asked:
		case <-time.After(10 * time.Second):
			t.Fatal("the member is not asked")
		}
		verdicts <- err
	}
	v.keep("a", "a:1")
	answer(timeout)
	answer(nil)
	for range v.patience - 1 {
		answer(timeout)
	}
	<-asked // every verdict so far is applied
	if !v.keep("a", "a:1") {
		t.Fatalf("dropped after an answer and %d timeouts in a row (patience %d)", v.patience-1, v.patience)
	}
	if len(kicks) != 0 {
		t.Fatal("a verdict to drop the member was announced")
	}
	verdicts <- timeout
	select { // the patience-th timeout drops it: it is not asked again first
	case <-kicks:
	case <-asked:
		t.Fatalf("asked again after %d timeouts in a row (patience %d)", v.patience, v.patience)
	case <-time.After(10 * time.Second):
		t.Fatal("no verdict came back")
	}
	if v.keep("a", "a:1") {
		t.Fatalf("kept after %d timeouts in a row", v.patience)
	}
	if got := v.vouched.Load(); got != 1 {
		t.Fatalf("vouched %d, want 1", got)
	}
}

// However well it answers, a member gossip keeps dead leaves the ring after
// max; pruned (alive again) and then declared dead again, it is asked afresh.
func TestVoucherHoldsAtMostMaxAndForgetsOnPrune(t *testing.T) {
	peers := &fakePeers{up: map[string]bool{"a:1": true}, hung: map[string]bool{}}
	v, kicks := testVoucher(t, peers, 50*time.Millisecond)
	v.keep("a", "a:1")
	awaitKick(t, kicks)
	if v.keep("a", "a:1") {
		t.Fatal("a member is kept past max")
	}
	v.prune(map[string]bool{})
	if !v.keep("a", "a:1") {
		t.Fatal("a member declared dead again is not asked afresh")
	}
	v.prune(map[string]bool{"a": true})
	v.mu.Lock()
	_, ok := v.held["a"]
	v.mu.Unlock()
	if !ok {
		t.Fatal("prune forgot a member still dead on the ring")
	}
}

// Once closed, no member is held and no ping starts.
func TestVoucherClosed(t *testing.T) {
	peers := &fakePeers{up: map[string]bool{"a:1": true}, hung: map[string]bool{}}
	v, _ := testVoucher(t, peers, time.Hour)
	v.close()
	if v.keep("a", "a:1") {
		t.Fatal("a closed voucher holds a member")
	}
	if n := peers.pings.Load(); n != 0 {
		t.Fatalf("%d pings after close", n)
	}
}
