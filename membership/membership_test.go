package membership

import (
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"stallfree/internal/testutil"
)

func join(t *testing.T, name string, key []byte, seeds ...string) *Membership {
	t.Helper()
	m, err := Join(Config{Name: name, Bind: testutil.FreeAddr(t), Join: seeds, SecretKey: key, Timing: LocalTiming(),
		Meta: Meta{HTTP: "h-" + name, Capacity: 42}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func waitAlive(t *testing.T, m *Membership, want []string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !slices.Equal(m.Alive(), want) {
		if time.Now().After(deadline) {
			t.Fatalf("%s sees %v, want %v", m.Name(), m.Alive(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Members join with their metadata; a node with another key never enters
// the list; a node that leaves is seen as left, one that crashes as dead.
func TestJoinLeaveCrashAndKey(t *testing.T) {
	key := []byte("0123456789abcdef")
	a := join(t, "a", key)
	defer a.Leave(time.Second)
	seed := a.ml.LocalNode().Address()
	b := join(t, "b", key, seed)
	c := join(t, "c", key, seed)
	d := join(t, "d", key, seed)
	waitAlive(t, a, []string{"a", "b", "c", "d"})
	if m, ok := a.Get("b"); !ok || m.Meta.HTTP != "h-b" || m.Meta.Capacity != 42 {
		t.Fatalf("meta of b: %+v", m)
	}

	// The stranger's gossip cannot be decrypted: it never enters a's list,
	// and a's never enters the stranger's. Its join fails outright, so there
	// is nothing to wait for: the lists are as they will stay.
	stranger, err := Join(Config{Name: "x", Bind: testutil.FreeAddr(t), Join: []string{seed}, SecretKey: []byte("fedcba9876543210"),
		Timing: LocalTiming(), Meta: Meta{HTTP: "h-x"}, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Leave(time.Second)
	if slices.Contains(a.Alive(), "x") || len(stranger.Alive()) != 1 {
		t.Fatalf("stranger joined: a sees %v, x sees %v", a.Alive(), stranger.Alive())
	}

	// c says goodbye: the others see it as left, not failed.
	if err := c.Leave(time.Second); err != nil {
		t.Fatalf("leave: %v", err)
	}
	waitAlive(t, a, []string{"a", "b", "d"})
	// Awaited, not read at once: the goodbye may be handled just after
	// gossip's own leave (TestGoodbyeAfterTheLeaveEvent).
	testutil.Await(t, "a to record c as left", func() bool { m, _ := a.Get("c"); return m.State == Left })

	// b stops without a goodbye: shutting down memberlist looks like a crash.
	close(b.stop)
	b.wg.Wait()
	b.ml.Shutdown()
	waitAlive(t, a, []string{"a", "d"})
	if m, _ := a.Get("b"); m.State != Dead {
		t.Fatalf("b crashed but is %s", m.State)
	}
	if err := d.Leave(time.Second); err != nil {
		t.Fatalf("leave: %v", err)
	}
}

// The goodbye (TCP) and gossip's leave (UDP) are handled on different
// goroutines, in either order: a member that said goodbye is recorded as
// left whichever comes first, and one that did not as dead.
func TestGoodbyeAfterTheLeaveEvent(t *testing.T) {
	m := &Membership{log: slog.New(slog.DiscardHandler), members: map[string]*Member{}, leaving: map[string]bool{}, changed: make(chan struct{}, 1)}
	d, ev := delegate{m}, events{m}
	for _, name := range []string{"first", "late", "silent"} {
		ev.NotifyJoin(&memberlist.Node{Name: name, Addr: net.IPv4(127, 0, 0, 1), Port: 7946})
	}
	d.NotifyMsg([]byte(goodbye + "first"))
	ev.NotifyLeave(&memberlist.Node{Name: "first", Addr: net.IPv4(127, 0, 0, 1), Port: 7946})
	ev.NotifyLeave(&memberlist.Node{Name: "late", Addr: net.IPv4(127, 0, 0, 1), Port: 7946})
	<-m.Changed()
	d.NotifyMsg([]byte(goodbye + "late"))
	select {
	case <-m.Changed():
	default:
		t.Error("a late goodbye changed a member without signalling it")
	}
	ev.NotifyLeave(&memberlist.Node{Name: "silent", Addr: net.IPv4(127, 0, 0, 1), Port: 7946})
	want := map[string]State{"first": Left, "late": Left, "silent": Dead}
	for name, st := range want {
		if mem, ok := m.Get(name); !ok || mem.State != st {
			t.Errorf("%s: %+v, want %s", name, mem, st)
		}
	}
	if len(m.leaving) != 0 {
		t.Errorf("goodbyes still pending: %v", m.leaving)
	}
}
