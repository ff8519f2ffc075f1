// Package testutil holds what the tests of every package need, once: a free
// loopback address, an await with a deadline, a logger that discards, a memfd, a
// dataset's files on disk, and the rule for tests too long for -short.
// It imports nothing of the product, so any package's tests may use it.
package testutil

import (
	crand "crypto/rand"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Patience is how long Await waits: far past what any condition needs on a
// loaded 2-core machine, so a failure means the condition never held.
const Patience = 30 * time.Second

// FreeAddr is a loopback host:port nothing listens on now.
func FreeAddr(t testing.TB) string { t.Helper(); return FreeAddrOn(t, "127.0.0.1") }

// FreeAddrOn is a host:port on host nothing listens on now, over TCP or
// UDP (gossip binds both), and one no other test of any package is handed
// while t runs.
//
// The port is drawn below Linux's ephemeral range (32768 and up), not asked
// of the kernel: a port the kernel hands out for :0 is one it also hands
// out as the source port of outgoing connections, and between this call and
// the moment a test's process binds it, one of the many connections the
// other test packages make could take it ("address already in use": CI saw
// it). Drawing alone is not enough either: go test runs packages in
// parallel processes, and two of them drew the same port within a second
// (CI saw that too). So a drawn port is reserved by an flock on a file named
// for it under the temporary directory, held until t ends; a port another
// process (or another call here) holds is drawn again.
func FreeAddrOn(t testing.TB, host string) string {
	t.Helper()
	for range 500 {
		addr := net.JoinHostPort(host, strconv.Itoa(lowPortMin+rand.IntN(lowPortMax-lowPortMin)))
		if ReserveAddr(t, addr) {
			return addr
		}
	}
	t.Fatalf("no free port on %s among 500 drawn in [%d, %d)", host, lowPortMin, lowPortMax)
	return ""
}

// ReserveAddr reports whether addr's port is free now (over TCP and UDP)
// and no other test holds it, and if so reserves it until t ends, as
// FreeAddrOn does with the ports it draws. For a test that needs ports of
// a given shape (the README's 710$i).
func ReserveAddr(t testing.TB, addr string) bool {
	t.Helper()
	_, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	held, ok := reserve(filepath.Join(portLocks(t), port))
	if !ok {
		return false // another test has it
	}
	if !bindable(addr) {
		held.Close()
		return false // something else listens there
	}
	t.Cleanup(func() { held.Close() }) // closing the file drops the lock
	return true
}

// portLocks is the directory of the ports' lock files, shared by every
// user's tests on the host (sticky and writable by all, as /tmp is). The
// files are never removed: removing one while another holder has it open
// would let a third lock a new file of the same name.
func portLocks(t testing.TB) string {
	dir := filepath.Join(os.TempDir(), "stallfree-test-ports")
	if err := os.Mkdir(dir, 0o777); err == nil {
		os.Chmod(dir, 0o777|os.ModeSticky) // past the umask
	} else if !os.IsExist(err) {
		t.Fatal(err)
	}
	return dir
}

// reserve takes an exclusive lock on path without waiting. Locks belong to
// open files, so a second reservation fails in this process as in another.
// Read-only: a lock file another user made can be locked too.
func reserve(path string) (*os.File, bool) {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o444)
	if err != nil {
		return nil, false
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, false
	}
	return f, true
}

// bindable reports whether addr can be bound over TCP and over UDP now.
func bindable(addr string) bool {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	l.Close()
	pc, err := net.ListenPacket("udp", addr)
	if err != nil {
		return false
	}
	pc.Close()
	return true
}

// The range FreeAddrOn draws from: above the well-known and registered
// ports most services sit on, below the ephemeral ones.
const lowPortMin, lowPortMax = 20000, 32768

// Await waits until cond holds, failing the test after Patience. what names
// the condition in the failure.
func Await(t testing.TB, what string, cond func() bool) {
	t.Helper()
	AwaitWithin(t, Patience, what, cond)
}

// AwaitWithin is Await with a deadline of d.
func AwaitWithin(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Within(d, cond) {
		t.Fatalf("still waiting for %s after %v", what, d)
	}
}

// Within reports whether cond holds within d, asking every few milliseconds.
func Within(d time.Duration, cond func() bool) bool {
	for deadline := time.Now().Add(d); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			return false
		}
	}
	return true
}

// ProcessCPU is the CPU time (user and system) this process has used: a
// benchmark reports it beside the wall time, since what an op costs in CPU
// survives a change of machine.
func ProcessCPU(tb testing.TB) time.Duration {
	tb.Helper()
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		tb.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Discard is a logger that drops everything.
func Discard() *slog.Logger { return slog.New(slog.DiscardHandler) }

// WriteTree writes files (by slash-separated key) under a new temporary
// directory and returns it.
func WriteTree(t testing.TB, files map[string][]byte) string {
	t.Helper()
	dir := t.TempDir()
	for key, b := range files {
		p := filepath.Join(dir, filepath.FromSlash(key))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// RandomFiles is a directory dataset of n files of size random bytes,
// item0000.bin on, and the bytes of each by key.
func RandomFiles(t testing.TB, n, size int) (string, map[string][]byte) {
	t.Helper()
	files := make(map[string][]byte, n)
	for i := range n {
		b := make([]byte, size)
		for j := range b {
			b[j] = byte(rand.Uint32())
		}
		files[fmt.Sprintf("item%04d.bin", i)] = b
	}
	return WriteTree(t, files), files
}

// ClusterKey is the key for every cluster a test of this process starts
// (catalog.Config.Key, node.Config.ClusterKey): the same within the process,
// different from any other process's. go test runs packages side by side
// (and gremlins runs mutants so), and a port that one process's raft gave up
// can be handed by FreeAddr to another's while the first one's members still
// send to it. A keyless raft would take such a stranger's higher term and
// follow its leader; a keyed one fails its handshake.
func ClusterKey() []byte { return processKey() }

// processKey is one value per process by design: tests of one process
// share a cluster's key without passing it around.
var processKey = sync.OnceValue(func() []byte {
	return []byte(crand.Text())
})

// Long skips t under -short: tests that start clusters, wait out timers or
// move many items take more than a few seconds, and `make test-short` is
// for editing. `make test` runs them all.
func Long(t testing.TB) {
	t.Helper()
	if testing.Short() {
		t.Skip("long test: skipped under -short (make test runs it)")
	}
}

// Memfd is a file a process on this host filled, as a job hands one over to
// its node: a memfd (memfd_create with flags, e.g. unix.MFD_ALLOW_SEALING)
// holding data, closed when the test ends, and its inode. It skips the
// test where the kernel has no memfd_create.
func Memfd(t testing.TB, data []byte, flags int) (*os.File, uint64) {
	t.Helper()
	fd, err := unix.MemfdCreate("stallfree-test", unix.MFD_CLOEXEC|flags)
	if err != nil {
		t.Skipf("memfd_create: %v", err)
	}
	f := os.NewFile(uintptr(fd), "stallfree-test")
	t.Cleanup(func() { f.Close() })
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		t.Fatal(err)
	}
	return f, st.Ino
}

// KnockWithoutKey opens n connections to addr that each send 64 zero bytes
// (no handshake of the cluster key's) and reads until the server hangs up,
// so that the server has handled each (and logged, if it does) on return.
func KnockWithoutKey(t testing.TB, addr string, n int) {
	t.Helper()
	for range n {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.Write(make([]byte, 64))
		io.Copy(io.Discard, c)
		c.Close()
	}
}
