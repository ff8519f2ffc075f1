package bench

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"stallfree/client"
)

// proc is a server process the bench started; stop kills its process group.
type proc struct {
	name string
	cmd  *exec.Cmd
}

func startProc(name string, logTo string, bin string, args ...string) (*proc, error) {
	return startProcEnv(name, logTo, bin, nil, args...)
}

// startProcEnv starts bin with env added to this process's environment.
func startProcEnv(name string, logTo string, bin string, env []string, args ...string) (*proc, error) {
	cmd := exec.Command(bin, args...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	// Its own process group, so stop can end nginx's workers with it; and
	// told to stop if this benchmark dies (Ctrl-C, kill), which skips the
	// deferred stops and would leave servers running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if logTo != "" {
		f, err := os.Create(logTo)
		if err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = f, f
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	return &proc{name: name, cmd: cmd}, nil
}

func (p *proc) stop() {
	if p == nil || p.cmd.Process == nil {
		return
	}
	syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// pids returns the process and its children (nginx workers).
func (p *proc) pids() []int {
	root := p.cmd.Process.Pid
	out := []int{root}
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) > 1 && f[1] == strconv.Itoa(root) {
			out = append(out, pid)
		}
	}
	return out
}

func freePort() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}

func waitTCP(addr string, d time.Duration) error {
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	return fmt.Errorf("%s did not come up in %v", addr, d)
}

// startNginx serves dir from the page cache with sendfile, two workers.
func startNginx(work, dir string) (*proc, string, error) {
	addr := freePort()
	prefix := filepath.Join(work, "nginx")
	os.MkdirAll(filepath.Join(prefix, "logs"), 0o755)
	conf := fmt.Sprintf(`worker_processes 2;
daemon off;
user root;
pid %[1]s/nginx.pid;
error_log %[1]s/logs/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000000;
  keepalive_timeout 300s;
  open_file_cache max=100000 inactive=300s;
  default_type application/octet-stream;
  client_body_temp_path %[1]s/tmp;
  proxy_temp_path %[1]s/tmp;
  fastcgi_temp_path %[1]s/tmp;
  uwsgi_temp_path %[1]s/tmp;
  scgi_temp_path %[1]s/tmp;
  server { listen %[2]s; root %[3]s; }
}
`, prefix, addr, dir)
	cf := filepath.Join(prefix, "nginx.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return nil, "", err
	}
	p, err := startProc("nginx", filepath.Join(prefix, "stdout.log"), "nginx", "-c", cf, "-p", prefix)
	if err != nil {
		return nil, "", err
	}
	if err := waitTCP(addr, 10*time.Second); err != nil {
		p.stop()
		return nil, "", err
	}
	return p, addr, nil
}

// startMemcached starts memcached with room for the dataset and loads it.
func startMemcached(work string, keys []string, data func(string) []byte) (*proc, string, error) {
	addr := freePort()
	_, port, _ := net.SplitHostPort(addr)
	p, err := startProc("memcached", filepath.Join(work, "memcached.log"), "memcached",
		"-l", "127.0.0.1", "-p", port, "-U", "0", "-m", "2048", "-I", "4m", "-t", "2", "-c", "4096", "-u", "root")
	if err != nil {
		return nil, "", err
	}
	if err := waitTCP(addr, 10*time.Second); err != nil {
		p.stop()
		return nil, "", err
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		p.stop()
		return nil, "", err
	}
	defer c.Close()
	bw, br := bufio.NewWriter(c), bufio.NewReader(c)
	for _, k := range keys {
		b := data(k)
		fmt.Fprintf(bw, "set %s 0 0 %d\r\n", k, len(b))
		bw.Write(b)
		bw.WriteString("\r\n")
		bw.Flush()
		line, err := br.ReadString('\n')
		if err != nil || line != "STORED\r\n" {
			p.stop()
			return nil, "", fmt.Errorf("memcached set %s: %q %v", k, line, err)
		}
	}
	return p, addr, nil
}

// node is a cachenode process the bench started.
type nodeProc struct {
	*proc
	name, http, gossip string
	c                  *client.Client
	debug              string // its --pprof listener when profiling, else ""
}

func startNode(work, bin, name string, memory string, join string, extra ...string) (*nodeProc, error) {
	return startNodeEnv(work, bin, name, memory, join, nil, extra...)
}

func startNodeEnv(work, bin, name string, memory string, join string, env []string, extra ...string) (*nodeProc, error) {
	n := &nodeProc{name: name, http: freePort(), gossip: freePort()}
	state := filepath.Join(work, "state-"+name)
	os.RemoveAll(state) // every run forms a new cluster
	args := []string{"--name", name, "--http", n.http, "--peer", freePort(), "--gossip", n.gossip, "--raft", freePort(),
		"--data-dir", state, "--memory", memory, "--timing", "local", "--log-level", "warn"}
	if join == "" {
		args = append(args, "--bootstrap")
	} else {
		args = append(args, "--join", join)
	}
	args = append(args, extra...)
	p, err := startProcEnv(name, filepath.Join(work, name+".log"), bin, env, args...)
	if err != nil {
		return nil, err
	}
	n.proc = p
	n.c = client.New(n.http, "")
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := n.c.Stats(context.Background()); err == nil {
			return n, nil
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("%s did not start", name)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// cluster is n nodes started by startCluster.
type cluster []*nodeProc

func (cl cluster) stop() {
	for _, nd := range cl {
		nd.stop()
	}
}

func (cl cluster) pids() []int {
	var pids []int
	for _, nd := range cl {
		pids = append(pids, nd.pids()...)
	}
	return pids
}

// startCluster starts n nodes named PREFIX-1..n (the first bootstraps, the
// rest join it) with env added to their environment and extra flags, and
// waits until the first sees them all. Stop it when done, also on error.
func startCluster(c *Config, prefix string, n int, mem string, env []string, extra ...string) (cluster, error) {
	bin := filepath.Join(c.Bin, "cachenode")
	var cl cluster
	for i := range n {
		join := ""
		if i > 0 {
			join = cl[0].gossip
		}
		name := fmt.Sprintf("%s-%d", prefix, i+1)
		pprof := c.pprofArgs(name)
		nd, err := startNodeEnv(c.Work, bin, name, mem, join, env, append(slices.Clone(extra), pprof...)...)
		if err != nil {
			return cl, err
		}
		if len(pprof) == 2 {
			nd.debug = pprof[1]
		}
		cl = append(cl, nd)
	}
	return cl, waitMembers(cl[0], n)
}

// register registers the dataset (retrying until raft has a leader) and warms it.
func register(n *nodeProc, name, dir string) error {
	ctx := context.Background()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := n.c.PutDataset(ctx, name, dir)
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func warm(nodes []*nodeProc, name string) error {
	ctx := context.Background()
	for _, n := range nodes {
		if _, err := n.c.StartWarmup(ctx, name); err != nil {
			return err
		}
	}
	for _, n := range nodes {
		for {
			p, err := n.c.Warmup(ctx, name)
			if err != nil {
				return err
			}
			if p.Error != "" {
				return fmt.Errorf("warm-up on %s: %s", n.name, p.Error)
			}
			if !p.Running {
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

func rssOf(pid int) uint64 { return memOf(pid).rss }

// waitMembers waits until n sees want members alive and a raft leader.
func waitMembers(n *nodeProc, want int) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		cl, err := n.c.Cluster(context.Background())
		alive := 0
		if err == nil {
			for _, m := range cl.Members {
				if m.State == "alive" {
					alive++
				}
			}
		}
		if alive == want && cl.Leader != "" {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s sees %d of %d members alive", n.name, alive, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
