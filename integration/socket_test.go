package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
	"stallfree/internal/testutil"
)

// overSocket is an HTTP client that reaches whatever host it is asked for
// through the Unix socket at path.
func overSocket(path string) *http.Client {
	return &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", path)
	}}}
}

// The loader fast path: a node serves its API on DATA-DIR/stallfree.sock as
// well, mode 0600 and still checking the token, names it in /v1/cluster,
// and serves the same bytes there as over TCP.
func TestSocketServesTheAPIWithTheToken(t *testing.T) {
	const token = "sock-t0ken-1234"
	tf := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tf, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, nodeOpts{name: "sock", bootstrap: true, token: tf})
	sock := filepath.Join(n.dataDir, "stallfree.sock")
	fi, err := os.Stat(sock)
	if err != nil {
		t.Fatalf("default socket: %v", err)
	}
	if fi.Mode().Type() != os.ModeSocket || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %s has mode %v, want a socket with 0600 (a token is set)", sock, fi.Mode())
	}

	hc := overSocket(sock)
	get := func(path, bearer string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://stallfree"+path, nil)
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s over the socket: %v", path, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	for _, bearer := range []string{"", "wrong"} {
		if code, body := get("/v1/cluster", bearer); code != 401 {
			t.Errorf("token %q over the socket: %d %s, want 401", bearer, code, body)
		}
	}
	code, body := get("/v1/cluster", token)
	if code != 200 {
		t.Fatalf("/v1/cluster over the socket: %d %s", code, body)
	}
	var cl api.Cluster
	if err := json.Unmarshal(body, &cl); err != nil {
		t.Fatal(err)
	}
	if len(cl.Members) != 1 || cl.Members[0].Name != "sock" || cl.Members[0].Socket != sock {
		t.Errorf("members %+v, want self %q with socket %q", cl.Members, "sock", sock)
	}
	if tcp := mustCluster(t, n); tcp.Members[0].Socket != sock {
		t.Errorf("over TCP the self member names socket %q, want %q", tcp.Members[0].Socket, sock)
	}

	// Items of 20-60 KB: over gatherMin, so each leaves with its headers in
	// one writev, as over TCP.
	dir, files := dataset(t, 20, 40000)
	testutil.AwaitWithin(t, 20*time.Second, "a leader to register the dataset", func() bool {
		_, err := n.c.PutDataset(context.Background(), "ds", dir)
		return err == nil
	})
	keys := make([]string, 0, len(files))
	for key, want := range files {
		code, got := get("/v1/datasets/ds/items/"+key, token)
		if code != 200 || !bytes.Equal(got, want) {
			t.Fatalf("item %s over the socket: %d, %d bytes; want 200 and its %d bytes", key, code, len(got), len(want))
		}
		keys = append(keys, key)
	}
	batchBody, _ := json.Marshal(api.BatchRequest{Keys: keys})
	req, _ := http.NewRequest("POST", "http://stallfree/v1/datasets/ds/batch", bytes.NewReader(batchBody))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var items []struct {
		Key  string `msgpack:"key"`
		Data []byte `msgpack:"data"`
	}
	if err := msgpack.NewDecoder(resp.Body).Decode(&items); err != nil || len(items) != len(keys) {
		t.Fatalf("batch over the socket: %d items, %v", len(items), err)
	}
	for j, it := range items {
		if it.Key != keys[j] || !bytes.Equal(it.Data, files[keys[j]]) {
			t.Fatalf("batch item %d over the socket: key %q, %d bytes; want %q and its %d bytes", j, it.Key, len(it.Data), keys[j], len(files[keys[j]]))
		}
	}
}

// --socket "" turns it off (no file, no field); an explicit path a live
// node serves stops a second node with a message naming it.
func TestSocketOffAndInUse(t *testing.T) {
	off := startNode(t, nodeOpts{name: "nosock", bootstrap: true, extra: []string{"--socket", ""}})
	if _, err := os.Lstat(filepath.Join(off.dataDir, "stallfree.sock")); !os.IsNotExist(err) {
		t.Errorf("--socket \"\": socket file present (%v)", err)
	}
	if s := mustCluster(t, off).Members[0].Socket; s != "" {
		t.Errorf("--socket \"\": cluster names socket %q", s)
	}

	live := startNode(t, nodeOpts{name: "live", bootstrap: true})
	sock := filepath.Join(live.dataDir, "stallfree.sock")
	cmd := exec.Command(filepath.Join(binDir, "cachenode"), "--name", "second", "--bootstrap",
		"--data-dir", t.TempDir(), "--socket", sock, "--http", testutil.FreeAddrOn(t, "127.0.0.1"), "--peer", testutil.FreeAddrOn(t, "127.0.0.1"),
		"--gossip", testutil.FreeAddrOn(t, "127.0.0.1"), "--raft", testutil.FreeAddrOn(t, "127.0.0.1"), "--fast-timers")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "--socket: socket "+sock+" is in use by another process") {
		t.Errorf("second node on a live socket: err %v, output:\n%s", err, out)
	}
	if _, err := live.c.Stats(context.Background()); err != nil {
		t.Errorf("the first node stopped answering: %v", err)
	}
	if fi, err := os.Stat(sock); err != nil || fi.Mode().Perm() != 0o666 {
		t.Errorf("the first node's socket (no token: 0666): %v %v", fi, err)
	}

	// SIGKILL leaves the socket file behind; the restarted node replaces it.
	live.kill()
	if _, err := os.Lstat(sock); err != nil {
		t.Fatalf("after SIGKILL the socket file should still be there (stale): %v", err)
	}
	live.start()
	resp, err := overSocket(sock).Get("http://stallfree/healthz")
	if err != nil {
		t.Fatalf("the restarted node over its socket: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("the restarted node over its socket: %s", resp.Status)
	}
}
