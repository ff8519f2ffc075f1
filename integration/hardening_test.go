package integration

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
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
	"stallfree/clusterauth"
	"stallfree/internal/testutil"
)

// Each test here is an attack that once worked against a live node, run
// against real processes.

// authedStream is a raft stream layer that completes the cluster-key
// handshake, as a member does.
type authedStream struct {
	net.Listener
	key []byte
}

func (s authedStream) Dial(addr raft.ServerAddress, timeout time.Duration) (net.Conn, error) {
	return clusterauth.Dial(string(addr), timeout, s.key)
}

// waitReady waits until the node's /readyz answers 200: a leader, a caught-up
// catalog, its --dataset flags registered.
func waitReady(t *testing.T, n *proc) {
	t.Helper()
	testutil.AwaitWithin(t, 30*time.Second, n.name+" ready", func() bool {
		return n.c.JSON(context.Background(), http.MethodGet, "/readyz", nil, nil) == nil
	})
}

// readBody reads and closes the body of a response that err did not stop.
func readBody(t *testing.T, resp *http.Response, err error) []byte {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

func leaderOf(t *testing.T, nodes []*proc) *proc {
	t.Helper()
	cl, err := nodes[0].c.Cluster(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.name == cl.Leader {
			return n
		}
	}
	t.Fatalf("no leader among %v (leader %q)", names(nodes), cl.Leader)
	return nil
}

// A stranger speaking hashicorp/raft's own protocol to the raft port gets no
// answer and changes nothing: before, forged AppendEntries were applied (a
// dataset deleted, /etc registered, /etc/shadow served).
func TestForgedRaftRPCsAreRefused(t *testing.T) {
	testutil.Long(t)
	const key = "0123456789abcdef0123456789abcdef"
	dir, files := dataset(t, 20, 1000)
	nodes := startCluster(t, clusterOpts{nodes: 2, key: key})
	register(t, nodes[0], "ds", dir)
	leader := leaderOf(t, nodes)

	stranger, err := raft.NewTCPTransport("127.0.0.1:0", nil, 1, 2*time.Second, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer stranger.Close()
	del, err := msgpack.Marshal(map[string]any{"op": 4, "name": "ds"}) // the catalog's delete-dataset command
	if err != nil {
		t.Fatal(err)
	}
	header := raft.RPCHeader{ProtocolVersion: raft.ProtocolVersionMax, ID: []byte("stranger"), Addr: []byte(stranger.LocalAddr())}
	hostile := &raft.AppendEntriesRequest{RPCHeader: header, Term: 1 << 40, LeaderCommitIndex: 1 << 40,
		Entries: []*raft.Log{{Index: 1 << 30, Term: 1 << 40, Type: raft.LogCommand, Data: del}}}
	probe := &raft.AppendEntriesRequest{RPCHeader: header, Term: 0} // stale term: harmless even if read
	for name, req := range map[string]*raft.AppendEntriesRequest{"hostile": hostile, "probe": probe} {
		var resp raft.AppendEntriesResponse
		if err := stranger.AppendEntries(raft.ServerID(leader.name), raft.ServerAddress(leader.raft), req, &resp); err == nil {
			t.Fatalf("%s AppendEntries without the cluster key was answered: %+v", name, resp)
		}
	}
	// The same probe through the handshake is answered: the handshake, not
	// a broken request, is what stopped the stranger.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	member := raft.NewNetworkTransport(authedStream{Listener: ln, key: clusterauth.Derive([]byte(key), "raft")}, 1, 2*time.Second, io.Discard)
	defer member.Close()
	var resp raft.AppendEntriesResponse
	if err := member.AppendEntries(raft.ServerID(leader.name), raft.ServerAddress(leader.raft), probe, &resp); err != nil {
		t.Fatalf("the probe through the handshake: %v", err)
	}
	if resp.Success || resp.Term == 0 {
		t.Fatalf("a stale-term probe got %+v, want a refusal carrying the current term", resp)
	}

	ctx := context.Background()
	for _, n := range nodes {
		cl, err := n.c.Cluster(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if cl.Leader != leader.name {
			t.Fatalf("%s: leader is now %q, was %s", n.name, cl.Leader, leader.name)
		}
		if _, err := n.c.Dataset(ctx, "ds"); err != nil {
			t.Fatalf("%s: dataset gone after the forged RPCs: %v", n.name, err)
		}
	}
	if err := readAll(ctx, nodes[1], "ds", files, len(files), 1); err != nil {
		t.Fatal(err)
	}
}

// --allow-source is checked on the resolved path: a symlink inside an
// allowed prefix that leads out of it is refused (it was registered and
// /etc/shadow served).
func TestAllowSourceFollowsSymlinks(t *testing.T) {
	base := t.TempDir()
	allowed := filepath.Join(base, "allowed")
	real, _ := dataset(t, 5, 100)
	if err := os.MkdirAll(allowed, 0o755); err != nil {
		t.Fatal(err)
	}
	for link, target := range map[string]string{"rootlink": "/", "inside": filepath.Join(allowed, "data")} {
		if err := os.Symlink(target, filepath.Join(allowed, link)); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Rename(real, filepath.Join(allowed, "data")); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, nodeOpts{name: "solo", bootstrap: true, extra: []string{"--allow-source", allowed}})
	ctx := context.Background()
	waitReady(t, n)
	_, err := n.c.PutDataset(ctx, "escape", filepath.Join(allowed, "rootlink", "etc"))
	if e, ok := errors.AsType[*api.Error](err); !ok || e.Status != http.StatusForbidden {
		t.Fatalf("a symlink out of the allowed prefix: err %v, want 403", err)
	}
	if ds, err := n.c.Datasets(ctx); err != nil || len(ds) != 0 {
		t.Fatalf("datasets after the refusal: %v %v", ds, err)
	}
	// A symlink that stays inside is fine.
	if _, err := n.c.PutDataset(ctx, "inside", filepath.Join(allowed, "inside")); err != nil {
		t.Fatalf("a symlink inside the allowed prefix: %v", err)
	}
}

// procStatus reads a field (in kB) of /proc/PID/status.
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			v, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

func flood(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	var conns []net.Conn
	for range n {
		c, err := net.DialTimeout("tcp", addr, time.Second)
		if err != nil {
			break // the listen backlog is full: the flood has done its worst
		}
		conns = append(conns, c)
	}
	return conns
}

// With 1024 file descriptors, 1,100 idle connections each on the HTTP and
// peer ports used to kill the node (HTTP) or stop its peer listener for good.
// Now both ports refuse what is over their share and serve again as soon as
// the flood ends.
func TestFDExhaustionLeavesNodeServing(t *testing.T) {
	testutil.Long(t)
	if _, err := os.Stat("/usr/bin/prlimit"); err != nil {
		t.Fatal("prlimit (util-linux) is needed for this test")
	}
	dir, files := dataset(t, 40, 2000)
	a := startNode(t, nodeOpts{name: "n1", bootstrap: true, wrap: []string{"prlimit", "--nofile=1024:1024", "--"}})
	b := startNode(t, nodeOpts{name: "n2", join: []string{a.gossip}})
	nodes := []*proc{a, b}
	waitMembers(t, nodes, names(nodes))
	register(t, a, "ds", dir)
	ctx := context.Background()
	if _, err := a.c.StartWarmup(ctx, "ds"); err != nil {
		t.Fatal(err)
	}
	testutil.AwaitWithin(t, 30*time.Second, "n1's share cached", func() bool {
		s, err := a.c.Stats(ctx)
		return err == nil && s.ItemsCached > 0
	})

	conns := append(flood(t, a.http, 1100), flood(t, a.peer, 1100)...)
	t.Logf("flood: %d connections open", len(conns))
	select {
	case <-a.exited:
		t.Fatalf("n1 died under the flood:\n%s", a.log.String())
	default:
	}
	for _, c := range conns {
		c.Close()
	}
	start := time.Now()
	testutil.AwaitWithin(t, 5*time.Second, "n1 serving again", func() bool {
		return readAll(ctx, a, "ds", files, len(files), 2) == nil
	})
	// n2 reads n1's items over the peer port again.
	testutil.AwaitWithin(t, 5*time.Second, "peer fetches from n1 again", func() bool {
		before, err := b.c.Stats(ctx)
		if err != nil || readAll(ctx, b, "ds", files, len(files), 3) != nil {
			return false
		}
		after, err := b.c.Stats(ctx)
		return err == nil && after.HitsPeer > before.HitsPeer
	})
	t.Logf("serving again %v after the flood ended", time.Since(start).Round(time.Millisecond))
}

// Four concurrent batches of the whole dataset on an 8 MiB node used to take
// RSS to 1.95 GB. Now response bytes being assembled stay under
// --max-inflight-bytes: the batches over it wait (503 + Retry-After, which
// the Go client honours) and peak RSS stays near --memory + that bound.
func TestConcurrentHugeBatchesStayInBudget(t *testing.T) {
	testutil.Long(t)
	const items, size = 120, 256 << 10 // ~30 MiB of items
	const memory, inflight = 8 << 20, 40 << 20
	dir, files := dataset(t, items, size)
	n := startNode(t, nodeOpts{name: "solo", bootstrap: true, plain: true, memory: strconv.Itoa(memory),
		extra: []string{"--max-inflight-bytes", strconv.Itoa(inflight)}})
	register(t, n, "ds", dir)
	ctx := context.Background()
	all := make([]int, items)
	for i := range all {
		all[i] = i
	}
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2 {
				got, err := n.c.Batch(ctx, "ds", all)
				if err != nil {
					errs <- err
					return
				}
				for _, it := range got {
					if !bytes.Equal(it.Data, files[it.Key]) {
						errs <- fmt.Errorf("%s: wrong bytes", it.Key)
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	peak := procStatus(t, n.cmd.Process.Pid, "VmHWM")
	const slack = 64 << 20 // the Go runtime, binaries, buffers of the HTTP stack
	t.Logf("peak RSS %d MiB (memory %d MiB + in-flight %d MiB + slack %d MiB)", peak>>20, memory>>20, inflight>>20, slack>>20)
	if peak > memory+inflight+slack {
		t.Fatalf("peak RSS %d MiB over --memory + --max-inflight-bytes + %d MiB", peak>>20, slack>>20)
	}

	// A job's minibatch is held to the batch limits: batch_size 1,048,576
	// made one 608 MB response.
	many, _ := dataset(t, 5000, 16)
	register(t, n, "many", many)
	if _, err := n.c.PutJob(ctx, api.Job{Name: "huge", Dataset: "many", WorldSize: 1, BatchSize: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	_, err := n.c.JobBatch(ctx, "huge", 0, 0, 0)
	if e, ok := errors.AsType[*api.Error](err); !ok || e.Status != http.StatusRequestEntityTooLarge {
		t.Fatalf("a minibatch of 1,048,576 samples: err %v, want 413", err)
	}
}

// A FIFO put where a file was blocked open(2) forever; 10k such requests
// made 9,901 threads and then the fd limit killed the node. Now only regular
// files are read, and every read is bounded by --storage-timeout.
func TestFIFOInDatasetAnswersInTime(t *testing.T) {
	testutil.Long(t)
	dir, files := dataset(t, 10, 1000)
	n := startNode(t, nodeOpts{name: "solo", bootstrap: true, extra: []string{"--storage-timeout", "2s"}})
	register(t, n, "ds", dir)
	victim := "c0/item_00000.bin"
	p := filepath.Join(dir, victim)
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(p, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	statuses := make(chan int, 50)
	start := time.Now()
	for range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := n.c.ItemByKey(ctx, "ds", victim)
			e, _ := errors.AsType[*api.Error](err)
			if e == nil {
				statuses <- 200
				return
			}
			statuses <- e.Status
		}()
	}
	wg.Wait()
	close(statuses)
	took := time.Since(start)
	for s := range statuses {
		if s != http.StatusConflict { // "source changed: KEY" (502 before v4)
			t.Fatalf("an item that became a FIFO: status %d, want 409", s)
		}
	}
	t.Logf("50 requests for the FIFO answered in %v", took.Round(time.Millisecond))
	delete(files, victim)
	for k, want := range files {
		it, err := n.c.ItemByKey(ctx, "ds", k)
		if err != nil || !bytes.Equal(it.Data, want) {
			t.Fatalf("%s after the FIFO: %v", k, err)
		}
	}
}

// At --log-level debug, a request whose headers overflow the read buffer had
// its bearer token logged by fasthttp and echoed in the 400 body.
func TestTokenNeverLoggedOrEchoed(t *testing.T) {
	const token = "s3cr3t-t0ken-9f8e7d6c5b4a"
	tf := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tf, []byte(token), 0o600); err != nil {
		t.Fatal(err)
	}
	n := startNode(t, nodeOpts{name: "solo", bootstrap: true, token: tf, logLevel: "debug"})
	send := func(raw string) string {
		c, err := net.DialTimeout("tcp", n.http, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		io.WriteString(c, raw)
		b, _ := io.ReadAll(c)
		return string(b)
	}
	big := strings.Repeat("x", 6000)
	answers := []string{
		send("GET /v1/stats HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer " + token + "\r\nX-Big: " + big + "\r\nConnection: close\r\n\r\n"),
		send("GET /v1/stats HTTP/1.1\r\nHost: a\r\nX-Big: " + big + "\r\nAuthorization: Bearer " + token + "\r\nConnection: close\r\n\r\n"),
		send("GARBAGE /v1 HTTP/9\r\nAuthorization: Bearer " + token + "\r\n\x00\x01\r\n\r\n"),
		send("GET /v1/stats HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer wrong-" + token[:6] + "\r\nConnection: close\r\n\r\n"),
	}
	for i, a := range answers {
		if strings.Contains(a, token) {
			t.Fatalf("answer %d echoes the token:\n%s", i, a)
		}
		if !strings.HasPrefix(a, "HTTP/1.1 4") {
			t.Fatalf("answer %d is not a 4xx:\n%.300s", i, a)
		}
	}
	n.stop()
	logged := n.log.String()
	if strings.Contains(logged, token) {
		t.Fatalf("the token is in the debug log")
	}
	if !strings.Contains(logged, "level=DEBUG") {
		t.Fatal("no debug lines logged: the test did not look at a debug log")
	}
}

// /metrics passes the linter `promtool check metrics` runs (counters end in
// _total, help and type present, names valid).
func TestMetricsPassPromlint(t *testing.T) {
	dir, _ := dataset(t, 5, 100)
	n := startNode(t, nodeOpts{name: "solo", bootstrap: true, extra: []string{"--dataset", "ds=" + dir, "--policy", "clairvoyant"}})
	waitReady(t, n)
	resp, err := http.Get("http://" + n.http + "/metrics")
	body := readBody(t, resp, err)
	problems, err := promlint.New(bytes.NewReader(body)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	if !bytes.Contains(body, []byte("stallfree_loader_wait_seconds_total")) {
		t.Fatal("no stallfree_loader_wait_seconds_total in /metrics")
	}
}

// An empty batch answered Content-Length: 1 and sent no byte.
func TestEmptyBatchIsAnEmptyArray(t *testing.T) {
	dir, _ := dataset(t, 5, 100)
	n := startNode(t, nodeOpts{name: "solo", bootstrap: true, extra: []string{"--dataset", "ds=" + dir}})
	waitReady(t, n)
	resp, err := n.c.Do(context.Background(), http.MethodPost, "/v1/datasets/ds/batch", api.BatchRequest{Indices: []int{}})
	body := readBody(t, resp, err)
	if !bytes.Equal(body, []byte{0x90}) || resp.ContentLength != 1 {
		t.Fatalf("empty batch: Content-Length %d, body % x; want 1 and 90 (an empty msgpack array)", resp.ContentLength, body)
	}
}

func metric(t *testing.T, n *proc, name string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + n.http + "/metrics")
	b := readBody(t, resp, err)
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, name+" "); ok {
			v, err := strconv.ParseFloat(rest, 64)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
	}
	t.Fatalf("no %s in /metrics", name)
	return 0
}

// Every GET of a new epoch's order wrote raft (1,100 GETs grew raft.db from
// 0.5 to 1 MB) and epoch 2^40 was accepted. Now an epoch is pinned once, and
// only the next epoch a job can reach.
func TestReadsPinOnlyTheNextEpochOnce(t *testing.T) {
	dir, _ := dataset(t, 40, 100)
	n := startNode(t, nodeOpts{name: "solo", bootstrap: true, extra: []string{"--dataset", "ds=" + dir}})
	waitReady(t, n)
	ctx := context.Background()
	if _, err := n.c.PutJob(ctx, api.Job{Name: "j", Dataset: "ds", WorldSize: 1, BatchSize: 8}); err != nil {
		t.Fatal(err)
	}
	before := metric(t, n, "stallfree_catalog_applied_index")
	for range 30 {
		if _, err := n.c.RankOrder(ctx, "j", 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if d := metric(t, n, "stallfree_catalog_applied_index") - before; d != 1 {
		t.Fatalf("30 reads of epoch 0 moved the raft index by %v, want 1 (one pin)", d)
	}
	for _, e := range []int{2, 7, 1 << 40} {
		_, err := n.c.RankOrder(ctx, "j", e, 0)
		if ae, ok := errors.AsType[*api.Error](err); !ok || ae.Status != http.StatusBadRequest {
			t.Fatalf("epoch %d while the job is at 0: err %v, want 400", e, err)
		}
	}
	if _, err := n.c.RankOrder(ctx, "j", 1, 0); err != nil {
		t.Fatalf("epoch 1, the next: %v", err)
	}
}

// /readyz says why a node is not ready while /healthz says it is up.
func TestReadyzWaitsForJoin(t *testing.T) {
	n := startNode(t, nodeOpts{name: "lonely", join: []string{testutil.FreeAddrOn(t, "127.0.0.1")}})
	resp, err := http.Get("http://" + n.http + "/readyz")
	body := readBody(t, resp, err)
	if resp.StatusCode != http.StatusServiceUnavailable || !bytes.Contains(body, []byte("not joined")) {
		t.Fatalf("/readyz of a node whose seed is gone: %d %s", resp.StatusCode, body)
	}
	if err := n.c.JSON(context.Background(), http.MethodGet, "/healthz", nil, nil); err != nil {
		t.Fatalf("/healthz: %v", err)
	}
	dir, _ := dataset(t, 5, 100)
	ready := startNode(t, nodeOpts{name: "ready", bootstrap: true, extra: []string{"--dataset", "ds=" + dir}})
	waitReady(t, ready)
	if _, err := ready.c.Dataset(context.Background(), "ds"); err != nil {
		t.Fatalf("ready, but its --dataset is not there: %v", err)
	}
}
