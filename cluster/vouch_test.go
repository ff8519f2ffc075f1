package cluster

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// fakePeers answers pings for the addresses marked up, and counts them.
type fakePeers struct {
	mu    sync.Mutex
	up    map[string]bool
	pings atomic.Int64
}

func (f *fakePeers) ping(ctx context.Context, addr string) error {
	f.pings.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.up[addr] {
		return errors.New("connection refused")
	}
	return nil
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

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 10 s")
		}
	}
}

// A member declared dead that answers stays on the ring and its address stays
// usable; one that does not answer leaves it; both are asked, not assumed.
func TestVoucherKeepsOnlyMembersThatAnswer(t *testing.T) {
	peers := &fakePeers{up: map[string]bool{"a:1": true}}
	v, kicks := testVoucher(t, peers, time.Hour)
	if !v.keep("a", "a:1") || !v.keep("b", "b:1") {
		t.Fatal("a member is dropped before it was asked")
	}
	awaitKick(t, kicks) // b's refusal
	if v.keep("b", "b:1") || v.kept("b") {
		t.Fatal("a member that refused the ping is kept")
	}
	waitFor(t, func() bool { return v.kept("a") })
	if !v.keep("a", "a:1") {
		t.Fatal("a member that answered is dropped")
	}
	if got := v.vouched.Load(); got != 1 {
		t.Fatalf("vouched %d, want 1 (a, once however often it is asked)", got)
	}
	waitFor(t, func() bool { return peers.pings.Load() >= 4 }) // a is asked again and again
	if v.keep("c", "") {
		t.Fatal("a member without a peer address is kept")
	}
	// a stops answering: it leaves the ring at the next ping.
	peers.set("a:1", false)
	awaitKick(t, kicks)
	if v.keep("a", "a:1") || v.kept("a") {
		t.Fatal("a member that stopped answering is kept")
	}
}

// However well it answers, a member gossip keeps dead leaves the ring after
// max; pruned (alive again) and then declared dead again, it is asked afresh.
func TestVoucherHoldsAtMostMaxAndForgetsOnPrune(t *testing.T) {
	peers := &fakePeers{up: map[string]bool{"a:1": true}}
	v, kicks := testVoucher(t, peers, 50*time.Millisecond)
	v.keep("a", "a:1")
	awaitKick(t, kicks)
	if v.keep("a", "a:1") || v.kept("a") {
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
	peers := &fakePeers{up: map[string]bool{"a:1": true}}
	v, _ := testVoucher(t, peers, time.Hour)
	v.close()
	if v.keep("a", "a:1") {
		t.Fatal("a closed voucher holds a member")
	}
	if n := peers.pings.Load(); n != 0 {
		t.Fatalf("%d pings after close", n)
	}
}
