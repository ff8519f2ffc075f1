// Package integration starts real cachenode processes on loopback and drives
// them over real HTTP, gossip, raft and peer TCP.
package integration

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"stallfree/client"
	"stallfree/internal/testutil"
)

var binDir string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "stallfree-bin")
	if err != nil {
		panic(err)
	}
	binDir = dir
	build := exec.Command("go", "build", "-race", "-o", dir+"/", "stallfree/cmd/cachenode", "stallfree/cmd/cachectl")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	build.Env = append(os.Environ(), "CGO_ENABLED=1")
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building binaries:", err)
		os.Exit(1)
	}
	// Memory is measured on the binary users run: the race detector's
	// shadow memory would swamp what a test of RSS looks at.
	plain := exec.Command("go", "build", "-o", filepath.Join(dir, "plain")+"/", "stallfree/cmd/cachenode")
	plain.Stdout, plain.Stderr = os.Stderr, os.Stderr
	plain.Env = append(os.Environ(), "CGO_ENABLED=0")
	if err := plain.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building the plain binary:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is one cachenode process.
type proc struct {
	t                        *testing.T
	name                     string
	http, peer, gossip, raft string
	dataDir                  string
	args                     []string
	cmd                      *exec.Cmd
	exited                   chan struct{} // closed once cmd has exited and its output is all in log
	log                      *bytes.Buffer
	c                        *client.Client
	token                    string
	wrap                     []string
	binary                   string
	fixedGossip              bool // the test chose the gossip address, so it must not change
	started                  bool // has run before: other nodes may know its addresses
	env                      []string
	host                     *testHost // the network namespace it runs in; nil: loopback
}

type nodeOpts struct {
	name      string
	gossip    string // listen address; a free port when empty
	token     string // file with the HTTP token (--token-file)
	bootstrap bool
	join      []string
	memory    string
	policy    string
	extra     []string
	wrap      []string  // a command the node runs under, e.g. prlimit
	plain     bool      // the binary built without the race detector
	logLevel  string    // warn when empty
	env       []string  // added to the test's environment
	host      *testHost // run in this test host's network namespace, on its own address
	// defaultTimers leaves out --timing local: gossip and raft as deployed.
	defaultTimers bool
}

func startNode(t *testing.T, o nodeOpts) *proc {
	t.Helper()
	p := &proc{t: t, name: o.name, gossip: o.gossip, fixedGossip: o.gossip != "", dataDir: t.TempDir()}
	if o.memory == "" {
		o.memory = "256MiB"
	}
	if o.policy == "" {
		o.policy = "minio"
	}
	if o.logLevel == "" {
		o.logLevel = "warn"
	}
	p.wrap, p.env, p.host = o.wrap, o.env, o.host
	if o.host != nil {
		p.wrap = append([]string{"ip", "netns", "exec", o.host.ns}, p.wrap...)
	}
	p.binary = filepath.Join(binDir, "cachenode")
	if o.plain {
		p.binary = filepath.Join(binDir, "plain", "cachenode")
	}
	p.args = []string{"--name", o.name, "--data-dir", p.dataDir, "--memory", o.memory, "--policy", o.policy,
		"--log-level", o.logLevel}
	if !o.defaultTimers {
		p.args = append(p.args, "--timing", "local")
	}
	if o.bootstrap {
		p.args = append(p.args, "--bootstrap")
	}
	if len(o.join) > 0 {
		p.args = append(p.args, "--join", strings.Join(o.join, ","))
	}
	token := ""
	if o.token != "" {
		p.args = append(p.args, "--token-file", o.token)
		b, err := os.ReadFile(o.token)
		if err != nil {
			t.Fatal(err)
		}
		token = strings.TrimSpace(string(b))
	}
	// Shared-memory files (staged batches, checkpoint parts) go under the
	// test's own directory rather than the host's /dev/shm: a node this
	// test SIGKILLs leaves nothing behind once the test ends.
	if !slices.ContainsFunc(o.extra, func(a string) bool { return strings.HasPrefix(a, "--shm-dir") }) {
		shm := filepath.Join(p.dataDir, "shm")
		if err := os.MkdirAll(shm, 0o700); err != nil {
			t.Fatal(err)
		}
		p.args = append(p.args, "--shm-dir", shm)
	}
	p.args = append(p.args, o.extra...)
	p.token = token
	p.pickPorts()
	t.Cleanup(p.stop) // before start, so a node that fails to start is stopped and its log shown
	p.start()
	return p
}

// pickPorts chooses free loopback ports for every listener the test did not fix.
func (p *proc) pickPorts() {
	if p.host != nil {
		// A test host has its address to itself: the default ports.
		p.http, p.peer, p.gossip, p.raft = p.host.ip+":7070", p.host.ip+":7071", p.host.ip+":7946", p.host.ip+":7072"
		p.c = client.New(p.http, p.token)
		return
	}
	p.http, p.peer, p.raft = testutil.FreeAddrOn(p.t, "127.0.0.1"), testutil.FreeAddrOn(p.t, "127.0.0.1"), testutil.FreeAddrOn(p.t, "127.0.0.1")
	if !p.fixedGossip {
		p.gossip = testutil.FreeAddrOn(p.t, "127.0.0.1")
	}
	p.c = client.New(p.http, p.token)
}

func (p *proc) start() {
	p.t.Helper()
	for attempt := 1; ; attempt++ {
		p.log = &bytes.Buffer{}
		args := append([]string{"--http", p.http, "--peer", p.peer, "--gossip", p.gossip, "--raft", p.raft}, p.args...)
		argv := append(append(slices.Clone(p.wrap), p.binary), args...)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Stdout, cmd.Stderr = p.log, p.log
		if len(p.env) > 0 {
			cmd.Env = append(os.Environ(), p.env...)
		}
		if err := cmd.Start(); err != nil {
			p.t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); close(exited) }()
		p.cmd, p.exited = cmd, exited
		healthy := testutil.Within(30*time.Second, func() bool {
			select {
			case <-exited:
				return true
			default:
			}
			_, err := p.c.Stats(context.Background())
			return err == nil
		})
		select {
		case <-exited:
			// A port picked free can be taken by another process's outgoing
			// connection before the node binds it. A node nobody knows yet
			// can move; a restarted one must keep its addresses.
			if !p.started && attempt < 3 && strings.Contains(p.log.String(), "address already in use") {
				p.t.Logf("%s: a port was taken meanwhile; new ports (attempt %d)", p.name, attempt+1)
				p.pickPorts()
				continue
			}
			p.cmd = nil
			p.t.Fatalf("%s exited during start:\n%s", p.name, p.log.String())
		default:
		}
		if !healthy {
			p.t.Fatalf("timed out after 30s waiting for %s healthy", p.name)
		}
		p.started = true
		return
	}
}

// kill sends SIGKILL: no goodbye to the cluster, no flushing.
func (p *proc) kill() {
	if p.cmd != nil {
		p.cmd.Process.Signal(syscall.SIGKILL)
		<-p.exited
	}
	p.cmd = nil
}

func (p *proc) stop() {
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
	if p.t.Failed() {
		p.t.Logf("log of %s:\n%s", p.name, p.log.String())
	}
	p.cmd = nil
}

// dataset writes n random files and returns the directory and contents.
func dataset(t *testing.T, n, size int) (string, map[string][]byte) {
	t.Helper()
	dir := t.TempDir()
	files := map[string][]byte{}
	r := rand.New(rand.NewPCG(uint64(n), 3))
	for i := range n {
		key := fmt.Sprintf("c%d/item_%05d.bin", i%5, i)
		b := make([]byte, size/2+r.IntN(size))
		for j := range b {
			b[j] = byte(r.Uint32())
		}
		os.MkdirAll(filepath.Join(dir, fmt.Sprintf("c%d", i%5)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, key), b, 0o644); err != nil {
			t.Fatal(err)
		}
		files[key] = b
	}
	return dir, files
}

// mustStats is n's /v1/stats; an error fails the test (an ignored one would
// turn the checks built on it into no-ops).
func mustStats(t *testing.T, n *proc) client.Stats {
	t.Helper()
	s, err := n.c.Stats(context.Background())
	if err != nil {
		t.Fatalf("%s stats: %v", n.name, err)
	}
	return s
}

// mustCluster is n's /v1/cluster; an error fails the test.
func mustCluster(t *testing.T, n *proc) client.Cluster {
	t.Helper()
	cl, err := n.c.Cluster(context.Background())
	if err != nil {
		t.Fatalf("%s cluster: %v", n.name, err)
	}
	return cl
}

// analyzeOutput is the part of `cachectl --json analyze` the tests check.
type analyzeOutput struct {
	Model struct {
		Rates struct {
			Cold   float64 `json:"cold_items_per_s"`
			Cached float64 `json:"cached_items_per_s"`
		} `json:"rates"`
	} `json:"model"`
}
