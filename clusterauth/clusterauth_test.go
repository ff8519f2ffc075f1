package clusterauth

import (
	"errors"
	"net"
	"testing"
)

func handshake(t *testing.T, clientKey, serverKey []byte) (clientErr, serverErr error) {
	t.Helper()
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	done := make(chan error, 1)
	go func() { done <- Server(b, serverKey) }()
	clientErr = Client(a, clientKey)
	if clientErr != nil {
		a.Close() // the server is waiting for a proof that will not come
	}
	return clientErr, <-done
}

func TestSameKeyPasses(t *testing.T) {
	k := Derive([]byte("secret"), "raft")
	if c, s := handshake(t, k, k); c != nil || s != nil {
		t.Fatalf("client %v, server %v", c, s)
	}
}

// A party without the key fails on both sides, and keys derived for one use
// are no proof for another.
func TestOtherKeyFails(t *testing.T) {
	for name, pair := range map[string][2][]byte{
		"wrong secret": {Derive([]byte("secret"), "raft"), Derive([]byte("other"), "raft")},
		"other use":    {Derive([]byte("secret"), "transport"), Derive([]byte("secret"), "raft")},
		"no key":       {nil, Derive([]byte("secret"), "raft")},
	} {
		c, s := handshake(t, pair[0], pair[1])
		if !errors.Is(c, ErrAuth) || s == nil {
			t.Fatalf("%s: client %v, server %v; want both to fail", name, c, s)
		}
	}
}

func TestDerive(t *testing.T) {
	if Derive(nil, "x") != nil {
		t.Fatal("an empty secret derives a key")
	}
	if string(Derive([]byte("s"), "a")) == string(Derive([]byte("s"), "b")) {
		t.Fatal("two labels derive the same key")
	}
}
