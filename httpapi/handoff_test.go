package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
	"golang.org/x/sys/unix"

	"stallfree/api"
	"stallfree/groups"
	"stallfree/internal/testutil"
	"stallfree/node"
)

// A producer on the node's host hands its batch over as a memfd
// (PUT …?memfd=FD&ino=INODE over the Unix socket, no body): the node seals
// it and stages it as it is, and the other job maps that very file (its
// path is under the node's /proc/PID/fd). Over TCP, with a body, naming
// another inode or a file that cannot be sealed, the PUT is a 400 and
// nothing is staged.
func TestHandedOverBatchOverTheSocket(t *testing.T) {
	dir, files := writeDataset(t, 8, 10)
	sock := filepath.Join(t.TempDir(), "node.sock")
	h := startOn(t, dir, files, 1<<20, "lru", "", func(s *Server, n *node.Node) {
		g := groups.New(n.GroupHost(), groups.Config{Timeout: time.Hour, MaxBatchBytes: 1 << 20, Relay: n.Control().Relay()})
		t.Cleanup(g.Close)
		s.EnableGroups(g)
		ln, err := net.Listen("unix", sock)
		if err != nil {
			t.Fatal(err)
		}
		go s.Serve(ln)
	})
	// No keep-alive: a connection per request, none dialed spare and left
	// open past the test (main_test.go).
	local := &http.Client{Transport: &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", sock)
	}}}
	t.Cleanup(local.CloseIdleConnections)
	overSocket := func(method, path string, body []byte) reply {
		t.Helper()
		req, _ := http.NewRequest(method, "http://node"+path, bytes.NewReader(body))
		resp, err := local.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return reply{status: resp.StatusCode, header: resp.Header, body: b}
	}
	if r := h.do("PUT", "/v1/groups/g", []byte(`{"dataset":"ds","seed":1,"batch_size":1,"jobs":2}`)); r.status != 201 {
		t.Fatalf("group: %d %s", r.status, r.body)
	}
	data := []byte("a batch its producer wrote once")
	w, ino := testutil.Memfd(t, data, unix.MFD_ALLOW_SEALING)
	put := fmt.Sprintf("/v1/groups/g/epochs/0/batches/0?job=0&memfd=%d&ino=%d", w.Fd(), ino)
	// Refused first, each changing nothing (batch 0 is not staged after).
	for name, r := range map[string]reply{
		"over TCP":       h.do("PUT", put, nil),
		"with a body":    overSocket("PUT", put, []byte("bytes too")),
		"another inode":  overSocket("PUT", fmt.Sprintf("/v1/groups/g/epochs/0/batches/0?job=0&memfd=%d&ino=%d", w.Fd(), ino+1), nil),
		"no inode":       overSocket("PUT", fmt.Sprintf("/v1/groups/g/epochs/0/batches/0?job=0&memfd=%d", w.Fd()), nil),
		"not sealable":   overSocket("PUT", unsealable(t), nil),
		"no such fd":     overSocket("PUT", fmt.Sprintf("/v1/groups/g/epochs/0/batches/0?job=0&memfd=%d&ino=%d", 1<<20, ino), nil),
		"not a number":   overSocket("PUT", "/v1/groups/g/epochs/0/batches/0?job=0&memfd=x&ino=1", nil),
		"a negative one": overSocket("PUT", fmt.Sprintf("/v1/groups/g/epochs/0/batches/0?job=0&memfd=-1&ino=%d", ino), nil),
	} {
		if r.status != 400 {
			t.Errorf("%s: %d %s; want 400", name, r.status, r.body)
		}
	}
	if r := overSocket("GET", "/v1/groups/g/epochs/0/batches/0?job=1&wait=1ms", nil); r.status != 404 {
		t.Fatalf("batch 0 after refused hand-overs: %d %s", r.status, r.body)
	}
	if _, err := w.WriteAt([]byte("A"), 0); err != nil {
		t.Fatalf("a refused hand-over sealed the writer's file: %v", err)
	}
	data[0] = 'A'
	if r := overSocket("PUT", put, nil); r.status != 201 {
		t.Fatalf("handing over: %d %s", r.status, r.body)
	}
	if _, err := w.WriteAt([]byte("B"), 0); !errors.Is(err, syscall.EPERM) {
		t.Fatalf("the writer wrote after handing over: %v", err)
	}
	r := overSocket("GET", "/v1/groups/g/epochs/0/batches/0?job=1&map=1", nil)
	path := r.header.Get(api.HeaderGroupMap)
	if r.status != 200 || !strings.HasPrefix(path, fmt.Sprintf("/proc/%d/fd/", os.Getpid())) || r.header.Get(api.HeaderGroupMapSize) != fmt.Sprint(len(data)) {
		t.Fatalf("mapped read: %d %q size %q", r.status, path, r.header.Get(api.HeaderGroupMapSize))
	}
	if got, err := os.ReadFile(path); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the handed-over file reads %q, %v; want %q", got, err, data)
	}
	// The inode the job checks its open file against: the writer's memfd's.
	if got := r.header.Get(api.HeaderGroupMapIno); got != fmt.Sprint(ino) {
		t.Fatalf("%s %q; want the handed-over file's inode %d", api.HeaderGroupMapIno, got, ino)
	}
	var st unix.Stat_t
	if err := unix.Fstat(int(w.Fd()), &st); err != nil || r.header.Get(api.HeaderGroupMapDev) != fmt.Sprint(st.Dev) {
		t.Fatalf("%s %q; want the handed-over file's device %d (%v)", api.HeaderGroupMapDev, r.header.Get(api.HeaderGroupMapDev), st.Dev, err)
	}
}

// unsealable is a PUT naming a memfd made without MFD_ALLOW_SEALING.
func unsealable(t *testing.T) string {
	w, ino := testutil.Memfd(t, []byte("x"), 0)
	return fmt.Sprintf("/v1/groups/g/epochs/0/batches/0?job=0&memfd=%d&ino=%d", w.Fd(), ino)
}

// A staged batch whose file was let go between its lookup and its answer
// (dropped by the other jobs' reads, its linger over) is answered as any
// dropped batch, mapped or read: 404 with producer -1, so the asker makes
// it; a handed-over file's descriptor number reused by another file is let
// go too, never served.
func TestAStagedFileLetGoIsADroppedBatch(t *testing.T) {
	other, _ := testutil.Memfd(t, []byte("another batch"), 0)
	var st syscall.Stat_t
	if err := syscall.Fstat(int(other.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name   string
		staged groups.Staged
	}{
		{"removed", groups.Staged{Path: filepath.Join(t.TempDir(), "gone"), Size: 3}},
		{"a reused number", groups.Staged{Path: fmt.Sprintf("/proc/self/fd/%d", other.Fd()), Size: 13, Ino: st.Ino + 1, Dev: st.Dev}},
	} {
		for _, mapIt := range []bool{false, true} {
			var ctx fasthttp.RequestCtx
			ctx.Init2(unixConn(t), nil, false) // over the Unix socket: map=1 is answered with a path
			serveStaged(&ctx, c.staged, mapIt)
			if code, p := ctx.Response.StatusCode(), string(ctx.Response.Header.Peek(api.HeaderGroupProducer)); code != fasthttp.StatusNotFound || p != "-1" {
				t.Errorf("%s (map %v): %d, producer %q: %s", c.name, mapIt, code, p, ctx.Response.Body())
			}
		}
	}
	itself := groups.Staged{Path: fmt.Sprintf("/proc/self/fd/%d", other.Fd()), Size: 13, Ino: st.Ino, Dev: st.Dev}
	var ctx fasthttp.RequestCtx
	ctx.Init2(unixConn(t), nil, false)
	serveStaged(&ctx, itself, true)
	if ino := string(ctx.Response.Header.Peek(api.HeaderGroupMapIno)); ctx.Response.StatusCode() != fasthttp.StatusOK || ino != fmt.Sprint(st.Ino) {
		t.Fatalf("the file itself, mapped: %d, inode %q: %s", ctx.Response.StatusCode(), ino, ctx.Response.Body())
	}
	ctx.Response.Reset()
	serveStaged(&ctx, itself, false)
	if ctx.Response.StatusCode() != fasthttp.StatusOK {
		t.Fatalf("the file itself: %d %s", ctx.Response.StatusCode(), ctx.Response.Body())
	}
	if body := ctx.Response.Body(); string(body) != "another batch" {
		t.Fatalf("the file itself: %q", body)
	}
}

// unixConn is one end of a Unix socket pair, as a request over the node's
// Unix socket arrives on.
func unixConn(t *testing.T) net.Conn {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fds[1]) })
	f := os.NewFile(uintptr(fds[0]), "socketpair")
	defer f.Close()
	c, err := net.FileConn(f)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}
