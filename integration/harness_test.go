// Package integration starts real cachenode processes on loopback and drives
// them over real HTTP, gossip, raft and peer TCP.
package integration

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"stallfree/client"
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
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

func freePort(t *testing.T, host string) string {
	t.Helper()
	l, err := net.Listen("tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// proc is one cachenode process.
type proc struct {
	t                        *testing.T
	name                     string
	http, peer, gossip, raft string
	dataDir                  string
	args                     []string
	cmd                      *exec.Cmd
	log                      *bytes.Buffer
	c                        *client.Client
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
}

func startNode(t *testing.T, o nodeOpts) *proc {
	t.Helper()
	gossip := o.gossip
	if gossip == "" {
		gossip = freePort(t, "127.0.0.1")
	}
	p := &proc{t: t, name: o.name, http: freePort(t, "127.0.0.1"), peer: freePort(t, "127.0.0.1"),
		gossip: gossip, raft: freePort(t, "127.0.0.1"), dataDir: t.TempDir()}
	if o.memory == "" {
		o.memory = "256MiB"
	}
	if o.policy == "" {
		o.policy = "minio"
	}
	p.args = []string{"--name", o.name, "--http", p.http, "--peer", p.peer, "--gossip", p.gossip, "--raft", p.raft,
		"--data-dir", p.dataDir, "--memory", o.memory, "--policy", o.policy, "--fast-timers", "--log-level", "warn"}
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
	p.args = append(p.args, o.extra...)
	p.c = client.New(p.http, token)
	p.start()
	t.Cleanup(p.stop)
	return p
}

func (p *proc) start() {
	p.t.Helper()
	p.log = &bytes.Buffer{}
	p.cmd = exec.Command(filepath.Join(binDir, "cachenode"), p.args...)
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	if err := p.cmd.Start(); err != nil {
		p.t.Fatal(err)
	}
	waitFor(p.t, 30*time.Second, p.name+" healthy", func() bool {
		_, err := p.c.Stats(context.Background())
		return err == nil
	})
}

// kill sends SIGKILL: no goodbye to the cluster, no flushing.
func (p *proc) kill() {
	if p.cmd != nil && p.cmd.Process != nil {
		p.cmd.Process.Signal(syscall.SIGKILL)
		p.cmd.Wait()
	}
	p.cmd = nil
}

func (p *proc) stop() {
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
	if p.t.Failed() {
		p.t.Logf("log of %s:\n%s", p.name, p.log.String())
	}
	p.cmd = nil
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
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
