package testutil

import (
	"bytes"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// A free address can be listened on, and its port is below the kernel's
// ephemeral range, where no outgoing connection can take it meanwhile.
func TestFreeAddrIsFree(t *testing.T) {
	for range 20 {
		addr := FreeAddr(t)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		l.Close()
		_, port, _ := net.SplitHostPort(addr)
		if p, err := strconv.Atoi(port); err != nil || p < lowPortMin || p >= lowPortMax {
			t.Fatalf("%s: port outside [%d, %d)", addr, lowPortMin, lowPortMax)
		}
	}
}

// Addresses handed out while a test runs are never handed out twice, by
// this process or another: 300 draws among 12768 ports would repeat one
// about three times on average were ports only drawn. A port whose file
// another holder has locked is drawn again, and the lock goes when t ends.
func TestFreeAddrsAreReserved(t *testing.T) {
	seen := map[string]bool{}
	for range 300 {
		addr := FreeAddr(t)
		if seen[addr] {
			t.Fatalf("%s handed out twice", addr)
		}
		seen[addr] = true
	}
	var addr string
	t.Run("holder", func(t *testing.T) { addr = FreeAddr(t) })
	_, port, _ := net.SplitHostPort(addr)
	lock := filepath.Join(portLocks(t), port)
	held, ok := reserve(lock)
	if !ok {
		t.Fatalf("%s still reserved after its test ended", addr)
	}
	defer held.Close()
	if again, ok := reserve(lock); ok {
		again.Close()
		t.Fatalf("%s reserved twice at once", addr)
	}
}

// A given address is reserved once while its holder's test runs, and free
// again after.
func TestReserveAddr(t *testing.T) {
	addr := FreeAddr(t)
	if ReserveAddr(t, addr) {
		t.Fatalf("%s reserved a second time", addr)
	}
	var other string
	t.Run("holder", func(t *testing.T) {
		other = FreeAddr(t)
		if ReserveAddr(t, other) {
			t.Fatalf("%s reserved a second time", other)
		}
	})
	if !ReserveAddr(t, other) {
		t.Fatalf("%s still held after its test ended", other)
	}
}

// A port bound over UDP only is not free: gossip needs both.
func TestBindableWantsTCPAndUDP(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	if bindable(pc.LocalAddr().String()) {
		t.Fatalf("%s is bound over UDP, yet bindable", pc.LocalAddr())
	}
	addr := FreeAddr(t)
	if !bindable(addr) {
		t.Fatalf("free %s is not bindable", addr)
	}
}

func TestWithin(t *testing.T) {
	n := 0
	if !Within(time.Second, func() bool { n++; return n == 3 }) || n != 3 {
		t.Fatalf("held after %d asks", n)
	}
	if Within(20*time.Millisecond, func() bool { return false }) {
		t.Fatal("a condition that never holds held")
	}
}

func TestRandomFiles(t *testing.T) {
	dir, files := RandomFiles(t, 3, 16)
	if len(files) != 3 {
		t.Fatalf("%d files", len(files))
	}
	for key, want := range files {
		got, err := os.ReadFile(filepath.Join(dir, key))
		if err != nil || !bytes.Equal(got, want) || len(got) != 16 {
			t.Fatalf("%s: %v", key, err)
		}
	}
	nested := WriteTree(t, map[string][]byte{"a/b/c.bin": []byte("x")})
	if b, err := os.ReadFile(filepath.Join(nested, "a", "b", "c.bin")); err != nil || string(b) != "x" {
		t.Fatalf("nested key: %q %v", b, err)
	}
}

func TestClusterKeyIsThisProcesss(t *testing.T) {
	k := ClusterKey()
	if len(k) < 16 || !bytes.Equal(k, ClusterKey()) {
		t.Fatalf("key %q, then %q: want one of at least 16 bytes, the same each time", k, ClusterKey())
	}
}
