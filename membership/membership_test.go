package membership

import (
	"log/slog"
	"net"
	"slices"
	"testing"
	"time"
)

func freeAddr(t *testing.T) string {
	t.Helper()
	// memberlist binds UDP and TCP on the same port; pick one free for both.
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		u, err := net.ListenPacket("udp", addr)
		l.Close()
		if err == nil {
			u.Close()
			return addr
		}
	}
	t.Fatal("no free port")
	return ""
}

func join(t *testing.T, name string, key []byte, seeds ...string) *Membership {
	t.Helper()
	m, err := Join(Config{Name: name, Bind: freeAddr(t), Join: seeds, SecretKey: key, Fast: true,
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

func TestJoinFailLeaveAndKey(t *testing.T) {
	key := []byte("0123456789abcdef")
	a := join(t, "a", key)
	defer a.Leave(time.Second)
	seed := a.ml.LocalNode().Address()
	b := join(t, "b", key, seed)
	c := join(t, "c", key, seed)
	defer c.Leave(time.Second)
	waitAlive(t, a, []string{"a", "b", "c"})
	if m, ok := a.Get("b"); !ok || m.Meta.HTTP != "h-b" || m.Meta.Capacity != 42 {
		t.Fatalf("meta of b: %+v", m)
	}

	stranger := join(t, "x", []byte("fedcba9876543210"), seed)
	defer stranger.Leave(time.Second)
	// The stranger's gossip cannot be decrypted: it never enters the list.
	time.Sleep(time.Second)
	if slices.Contains(a.Alive(), "x") || len(stranger.Alive()) != 1 {
		t.Fatalf("stranger joined: a sees %v, x sees %v", a.Alive(), stranger.Alive())
	}

	// Stop b without a goodbye: shutting down memberlist looks like a crash.
	close(b.stop)
	b.wg.Wait()
	b.ml.Shutdown()
	waitAlive(t, a, []string{"a", "c"})
	if m, _ := a.Get("b"); m.State != Dead {
		t.Fatalf("b is %s", m.State)
	}
}
