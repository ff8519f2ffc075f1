package clusterauth

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// serverOnPipe runs Server with key on one end of a pipe until the test
// ends; it returns the other end and the server's result.
func serverOnPipe(t *testing.T, key []byte) (net.Conn, <-chan error) {
	t.Helper()
	a, b := net.Pipe()
	t.Cleanup(func() { a.Close(); b.Close() })
	done := make(chan error, 1)
	go func() { done <- Server(b, key) }()
	return a, done
}

func handshake(t *testing.T, clientKey, serverKey []byte) (clientErr, serverErr error) {
	t.Helper()
	a, done := serverOnPipe(t, serverKey)
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

// Something that does not open with the magic is refused as not a node,
// before the server says anything.
func TestWrongMagicRefused(t *testing.T) {
	a, done := serverOnPipe(t, Derive([]byte("secret"), "raft"))
	go a.Write(append([]byte("GET "), make([]byte, nonceLen)...))
	if err := <-done; !errors.Is(err, ErrAuth) {
		t.Fatalf("a stranger's opening: %v, want ErrAuth", err)
	}
}

// Dial connects and proves the key; with the wrong key it fails and closes
// the connection (the server sees it end); a closed port fails to connect.
func TestDial(t *testing.T) {
	k := Derive([]byte("secret"), "raft")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	results := make(chan error, 2)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				err := Server(c, k)
				if err == nil {
					_, err = c.Write([]byte("ok"))
				}
				results <- err
			}()
		}
	}()
	c, err := Dial(ln.Addr().String(), time.Second, k)
	if err != nil {
		t.Fatalf("dial with the key: %v", err)
	}
	buf := make([]byte, 2)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ok" {
		t.Fatalf("after the handshake: %q, %v", buf, err)
	}
	c.Close()
	if err := <-results; err != nil {
		t.Fatalf("server side of a good dial: %v", err)
	}
	if _, err := Dial(ln.Addr().String(), time.Second, Derive([]byte("other"), "raft")); !errors.Is(err, ErrAuth) {
		t.Fatalf("dial with another key: %v, want ErrAuth", err)
	}
	if err := <-results; err == nil {
		t.Fatal("the server accepted a dial with another key")
	}
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := closed.Addr().String()
	closed.Close()
	if _, err := Dial(addr, time.Second, k); err == nil {
		t.Fatal("dialled a closed port")
	}
}

// A client that ignores the server's proof and answers with a made-up one
// (as an attacker replaying half a handshake would) is refused by the server.
func TestForgedClientProofRefused(t *testing.T) {
	a, done := serverOnPipe(t, Derive([]byte("secret"), "raft"))
	if _, err := a.Write(append([]byte(magic), make([]byte, nonceLen)...)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(a, make([]byte, nonceLen+macLen)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write(make([]byte, macLen)); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, ErrAuth) {
		t.Fatalf("a forged client proof: %v, want ErrAuth", err)
	}
}
