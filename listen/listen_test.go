package listen

import (
	"io"
	"net"
	"testing"
	"time"
)

// Over MaxConns a connection is told why and closed; closing an accepted one
// makes room again.
func TestCapRefusesThenAdmits(t *testing.T) {
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := Guard(raw, Options{Name: "test", MaxConns: 2, Refuse: func(c net.Conn) { io.WriteString(c, "busy") }})
	defer ln.Close()
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- c
		}
	}()
	dial := func() net.Conn {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := dial(), dial()
	defer a.Close()
	defer b.Close()
	first, second := <-accepted, <-accepted
	if Active(ln) != 2 {
		t.Fatalf("active %d, want 2", Active(ln))
	}
	third := dial()
	third.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(third)
	if string(got) != "busy" {
		t.Fatalf("the connection over the cap read %q, want the refusal then EOF", got)
	}
	first.Close()
	first.Close() // a second close must not count twice
	if Active(ln) != 1 {
		t.Fatalf("active %d after a close, want 1", Active(ln))
	}
	fourth := dial()
	defer fourth.Close()
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("no room made by the close")
	}
	second.Close()
}
