package listen

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// staleSocket leaves a socket file at path with nobody accepting on it, as
// a process killed with SIGKILL does.
func staleSocket(t *testing.T, path string) {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	ln.SetUnlinkOnClose(false)
	ln.Close()
}

func TestUnixReplacesAStaleSocketAndSetsTheMode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "n.sock")
	staleSocket(t, path)
	for _, mode := range []os.FileMode{0o600, 0o666} {
		ln, err := Unix(path, mode)
		if err != nil {
			t.Fatalf("mode %o over a stale socket: %v", mode, err)
		}
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm() != mode || fi.Mode().Type() != os.ModeSocket {
			t.Errorf("socket mode %v, want socket %o", fi.Mode(), mode)
		}
		c, err := net.Dial("unix", path)
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		c.Close()
		ln.Close()
		if _, err := os.Lstat(path); !os.IsNotExist(err) {
			t.Errorf("closing the listener left %s (%v)", path, err)
		}
		staleSocket(t, path) // the next round starts over a stale one again
	}
}

func TestUnixRefusesALiveSocketAndOtherFiles(t *testing.T) {
	dir := t.TempDir()
	live := filepath.Join(dir, "live.sock")
	ln, err := Unix(live, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() { // accept, as a serving node does
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	regular := filepath.Join(dir, "file")
	if err := os.WriteFile(regular, []byte("keep me"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, want string }{
		{live, "in use by another process"},
		{regular, "exists and is not a socket"},
		{"/" + strings.Repeat("x", 120), "Unix sockets allow at most 107"},
	} {
		if l, err := Unix(c.path, 0o600); err == nil || !strings.Contains(err.Error(), c.want) {
			if l != nil {
				l.Close()
			}
			t.Errorf("Unix(%s): err %v, want one saying %q", c.path, err, c.want)
		}
	}
	if b, err := os.ReadFile(regular); err != nil || string(b) != "keep me" {
		t.Errorf("the regular file was touched: %q, %v", b, err)
	}
	if c, err := net.Dial("unix", live); err != nil {
		t.Errorf("the live socket no longer answers: %v", err)
	} else {
		c.Close()
	}
}

// A socket path of exactly the kernel's limit (107 bytes and the NUL) is
// bound; one byte more is refused with the limit named, not the kernel's
// EINVAL.
func TestUnixPathLimit(t *testing.T) {
	dir := t.TempDir()
	at := func(n int) string { return filepath.Join(dir, strings.Repeat("s", n-len(dir)-1)) }
	ln, err := Unix(at(maxSocketPath), 0o600)
	if err != nil {
		t.Fatalf("a %d-byte path: %v", maxSocketPath, err)
	}
	ln.Close()
	if _, err := Unix(at(maxSocketPath+1), 0o600); err == nil || !strings.Contains(err.Error(), "at most 107") {
		t.Fatalf("a %d-byte path: %v", maxSocketPath+1, err)
	}
}
