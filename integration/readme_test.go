package integration

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"stallfree/client"
	"stallfree/internal/testutil"
)

// TestReadmeQuickstarts runs README.md's blocks as written: on the one-node
// quickstart's node the WebDataset blocks, the loader fast path's data block
// and its BatchLoader snippet, and the device path's DeviceLoader snippet
// (decode="jpeg"); on the three-node quickstart's cluster the training-jobs
// block. Each block is cut out of README.md by its heading, changed only by
// readmeRun.rewrite (ports, /tmp, the binaries, item sizes), and run by one
// bash -e under a timeout; the test checks what the blocks did on the nodes
// they started, then runs the quickstart's "when done" block in the same
// shell and checks that it stopped every node and removed every file the
// blocks wrote. A renamed flag, a missing wait, a snippet that raises or a
// cleanup that leaves something behind fails it; whatever is left running
// on a failure is killed.
func TestReadmeQuickstarts(t *testing.T) {
	testutil.Long(t)
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	md := string(readme)

	t.Run("one node", func(t *testing.T) {
		r := newReadmeRun(t)
		// The node binds the defaults, which are not in the block: given
		// as the environment instead (cachenode reads STALLFREE_<FLAG>,
		// cachectl STALLFREE_NODE).
		http := testutil.FreeAddr(t)
		r.env = append(r.env, "STALLFREE_HTTP="+http, "STALLFREE_PEER="+testutil.FreeAddr(t),
			"STALLFREE_RAFT="+testutil.FreeAddr(t), "STALLFREE_GOSSIP="+testutil.FreeAddr(t),
			"STALLFREE_NODE=http://"+http)
		r.ports = map[string]string{"7070": portOf(http)}
		cache := t.TempDir() // XDG_CACHE_HOME: where train.py's checkpoint goes
		// No __pycache__ written into the checkout's python/ by the snippets.
		r.env = append(r.env, "XDG_CACHE_HOME="+cache, "PYTHONDONTWRITEBYTECODE=1")
		script := r.rewrite(readmeBlock(t, md, "Quickstart (one node)", "sh", 0)) +
			r.rewrite(readmeBlock(t, md, "WebDataset tar shards", "sh", 0)) +
			r.rewrite(readmeBlock(t, md, "Loader fast path", "sh", 0))
		py := pythonHas("torch", "numpy", "PIL", "torchvision")
		if py {
			script += r.rewrite(readmeBlock(t, md, "Python loader", "sh", 1)) // train.py
			// README: "Saved as /tmp/loader.py: PYTHONPATH=python /usr/bin/python3 /tmp/loader.py",
			// from the checkout's root (here: PYTHONPATH is the checkout's python/).
			for i, b := range []string{
				readmeBlock(t, md, "WebDataset tar shards", "python", 0),
				readmeBlock(t, md, "Loader fast path", "python", 0),
				readmeBlock(t, md, "Device path", "python", 1),
			} {
				file := filepath.Join(r.scratch, fmt.Sprintf("snippet%d.py", i))
				script += fmt.Sprintf("cat > %s <<'README_PY'\n%sREADME_PY\n", file, r.rewrite(b)) +
					fmt.Sprintf("PYTHONPATH=%s /usr/bin/python3 %s\n", pythonDir(t), file)
			}
		} else {
			t.Log("/usr/bin/python3 lacks torch, numpy, Pillow or torchvision (make test installs them): the Python snippets are not run")
		}
		out := r.start(script, 4*time.Minute)

		if !strings.Contains(out, "wrong bytes in 0 items") {
			t.Errorf("epoch --verify did not report 0 wrong items:\n%s", out)
		}
		// curl ... | wc -c: the item's size, the file's.
		want, err := os.Stat(filepath.Join(r.tmp, "imgs", "class000", "img_0000000.bin"))
		if err != nil {
			t.Fatal(err)
		}
		if !regexp.MustCompile(`(?m)^\s*` + strconv.FormatInt(want.Size(), 10) + `\s*$`).MatchString(out) {
			t.Errorf("curl | wc -c did not print the item's size %d:\n%s", want.Size(), out)
		}
		c := client.New("http://"+http, "")
		st, err := c.Stats(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if st.ItemsCached < 2000 {
			t.Errorf("stats: %d items cached after warmup, want the 2000 of imgs", st.ItemsCached)
		}
		if _, err := c.Job(context.Background(), "resnet"); err != nil {
			t.Errorf("the loader block's job: %v", err)
		}
		if fi, err := os.Stat(filepath.Join(r.tmp, "s17.msgpack")); err != nil || fi.Size() < 100 {
			t.Errorf("curl .../samples/17 -o /tmp/s17.msgpack: %v (want a sample with a JPEG)", err)
		}
		if py {
			// train.py: 5 epochs of the 2000 items, its checkpoint under XDG_CACHE_HOME.
			if n := len(regexp.MustCompile(`(?m)^\{"epoch": [0-4], "samples": 2000, `).FindAllString(out, -1)); n != 5 {
				t.Errorf("train.py printed %d epochs of 2000 samples, want 5:\n%s", n, out)
			}
			if _, err := os.Stat(filepath.Join(cache, "stallfree", "train-example.pt")); err != nil {
				t.Errorf("train.py's checkpoint is not at its default, under XDG_CACHE_HOME: %v", err)
			}
			// The WebDataset snippet: sample 17's class (17 % 10) and a decoded JPEG's size.
			if !regexp.MustCompile(`(?m)^7 \(\d+, \d+\)$`).MatchString(out) {
				t.Errorf("the WebDataset snippet did not print class 7 and a PIL image's size:\n%s", out)
			}
			// The DeviceLoader snippet: 1024 JPEGs decoded, cropped to 56x56, in batches of 128.
			if n := len(regexp.MustCompile(`(?m)^x \(128, 3, 56, 56\) on (cpu|cuda), y \[[0-9, ]+\]$`).FindAllString(out, -1)); n != 8 {
				t.Errorf("the DeviceLoader snippet printed %d batches of (128, 3, 56, 56), want 8:\n%s", n, out)
			}
			lines := regexp.MustCompile(`(?m)^epoch ([01]): x \((\d+), 3, 64, 64\), y \[([0-9, ]+)\]$`).FindAllStringSubmatch(out, -1)
			seen := map[string]int{}
			for _, l := range lines {
				n, _ := strconv.Atoi(l[2])
				seen[l[1]] += n
			}
			// 1024 JPEGs, one rank: every item once per epoch, in batches of up to 256.
			if seen["0"] != 1024 || seen["1"] != 1024 {
				t.Errorf("the BatchLoader snippet saw %v samples per epoch, want 1024 in each of epochs 0 and 1:\n%s", seen, out)
			}
		}
		r.finish(r.rewrite(readmeBlock(t, md, "Quickstart (one node)", "sh", 1)), time.Minute)
	})

	t.Run("three nodes", func(t *testing.T) {
		r := newReadmeRun(t)
		// node i binds 127.0.0.1:710i (HTTP), 711i (peer), 712i (raft),
		// 794i (gossip): each prefix becomes one whose ports 1..3 are free.
		r.ports = map[string]string{}
		for _, p := range []string{"710", "711", "712", "794"} {
			r.ports[p] = freePortPrefix(t)
		}
		script := r.rewrite(readmeBlock(t, md, "Quickstart (three nodes on one machine)", "sh", 0)) +
			r.rewrite(readmeBlock(t, md, "Training jobs and locality", "sh", 0))
		out := r.start(script, 4*time.Minute)

		if !strings.Contains(out, "wrong bytes in 0 items") {
			t.Errorf("epoch --verify did not report 0 wrong items:\n%s", out)
		}
		ctx := context.Background()
		total := 0
		for i := 1; i <= 3; i++ {
			c := client.New(fmt.Sprintf("http://127.0.0.1:%s%d", r.ports["710"], i), "")
			cl, err := c.Cluster(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if len(cl.Members) != 3 {
				t.Errorf("node %d sees %d members, want 3", i, len(cl.Members))
			}
			st, err := c.Stats(ctx)
			if err != nil {
				t.Fatal(err)
			}
			total += st.ItemsCached
		}
		if total != 2000 {
			t.Errorf("the three nodes cache %d items in all, want each of the 2000 once", total)
		}
		if fi, err := os.Stat(filepath.Join(r.tmp, "b0.msgpack")); err != nil || fi.Size() == 0 {
			t.Errorf("curl .../batches/0 > /tmp/b0.msgpack wrote nothing (%v)", err)
		}
		r.finish(r.rewrite(readmeBlock(t, md, "Quickstart (three nodes on one machine)", "sh", 1)), time.Minute)
	})
}

// TestReadmeVenv runs README's venv block as written, in a copy of the
// checkout's python/ (pip builds in the source tree) and with
// XDG_CACHE_HOME in a temp dir: the venv lands outside the checkout, imports
// the client from itself, and the block leaves the tree as it found it.
func TestReadmeVenv(t *testing.T) {
	testutil.Long(t)
	if !pythonHas("setuptools", "wheel", "msgpack") {
		t.Skip("/usr/bin/python3 lacks setuptools, wheel or msgpack (make test installs them)")
	}
	readme, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	block := readmeBlock(t, string(readme), "Python loader", "sh", 0)
	root, cache := t.TempDir(), t.TempDir()
	src := filepath.Join(root, "python")
	if err := os.CopyFS(src, os.DirFS(pythonDir(t))); err != nil {
		t.Fatal(err)
	}
	for _, leftover := range []string{"build", "stallfree.egg-info"} { // from a checkout's earlier install
		if err := os.RemoveAll(filepath.Join(src, leftover)); err != nil {
			t.Fatal(err)
		}
	}
	before := tree(t, root)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-c", "set -eo pipefail\n"+block)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "XDG_CACHE_HOME="+cache, "PYTHONDONTWRITEBYTECODE=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("the venv block failed (%v):\n--- block ---\n%s\n--- output ---\n%s", err, block, out)
	}
	venv := filepath.Join(cache, "stallfree", "venv")
	out, err := exec.Command(filepath.Join(venv, "bin", "python"), "-c", "import stallfree; print(stallfree.__file__)").CombinedOutput()
	if err != nil || !strings.HasPrefix(string(out), venv+"/") {
		t.Errorf("the venv's python imports stallfree from %q (err %v), want from %s", out, err, venv)
	}
	if after := tree(t, root); !slices.Equal(after, before) {
		t.Errorf("the venv block changed the checkout's files: %d paths before, %d after; new: %q", len(before), len(after), newPaths(before, after))
	}
}

// tree is every path below root, sorted, __pycache__ left out.
func tree(t *testing.T, root string) []string {
	t.Helper()
	var paths []string
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && d.Name() == "__pycache__" {
			return filepath.SkipDir
		}
		paths = append(paths, p)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return paths
}

func newPaths(before, after []string) []string {
	var added []string
	for _, p := range after {
		if !slices.Contains(before, p) {
			added = append(added, p)
		}
	}
	return added
}

// rewrite is everything the test changes in a README block, in this
// order, and why; nothing else is touched:
//
//   - /tmp/ → a t.TempDir(): the blocks' data and state, removed after.
//   - bin/cachenode → the one TestMain built with -race; bin/cachectl → a
//     plain build, as make build makes it (gendata's JPEG encoding is
//     several times slower under -race); "make build" → ":" (both are built).
//   - python/examples/ → its absolute path: bash runs in an empty directory,
//     not the checkout's root.
//   - 127.0.0.1:PORT, localhost:PORT (or a port prefix like 710 in
//     127.0.0.1:710$i) → free ones (readmeRun.ports); the one-node block's
//     default ports come from the environment (STALLFREE_HTTP, ...).
//   - each gendata command gets "--size 4KiB" after its arguments (the last
//     --size wins): the same items, smaller, so the test stays short on 2
//     cores.
func (r *readmeRun) rewrite(block string) string {
	block = strings.ReplaceAll(block, "/tmp/", r.tmp+"/")
	block = regexp.MustCompile(`(?m)(^|\s)python/examples/`).ReplaceAllString(block, "${1}"+pythonDir(r.t)+"/examples/")
	block = regexp.MustCompile(`(?m)(^|[\s(])bin/cachenode\b`).ReplaceAllString(block, "${1}"+binDir+"/cachenode")
	block = regexp.MustCompile(`(?m)(^|[\s(])bin/cachectl\b`).ReplaceAllString(block, "${1}"+plainCachectl(r.t))
	block = regexp.MustCompile(`(?m)^make build$`).ReplaceAllString(block, ":")
	for from, to := range r.ports {
		block = regexp.MustCompile(`\b(127\.0\.0\.1|localhost):`+from).ReplaceAllString(block, "${1}:"+to)
	}
	return regexp.MustCompile(`(?m)(\bgendata [^#&|;\n]*?)(\s*(?:&&|\|\||;|#|$))`).ReplaceAllString(block, "$1 --size 4KiB$2")
}

// The substitution table changes what it lists and nothing else.
func TestReadmeRewrite(t *testing.T) {
	r := &readmeRun{t: t, tmp: "/T", ports: map[string]string{"7070": "45678", "710": "4321"}}
	ctl := plainCachectl(t)
	for in, want := range map[string]string{
		"make build": ":",
		"bin/cachectl gendata /tmp/a --items 2000 --size 4KiB && bin/cachectl datasets add a /tmp/a": ctl + " gendata /T/a --items 2000 --size 4KiB --size 4KiB && " + ctl + " datasets add a /T/a",
		"bin/cachectl gendata /tmp/j --format jpeg --size 16KiB    # note":                           ctl + " gendata /T/j --format jpeg --size 16KiB --size 4KiB    # note",
		"x=$(bin/cachenode --name n1 &)":                                                             "x=$(" + binDir + "/cachenode --name n1 &)",
		"curl -s localhost:7070/v1 # 127.0.0.1:7070":                                                 "curl -s localhost:45678/v1 # 127.0.0.1:45678",
		"--http 127.0.0.1:710$i --join 127.0.0.1:7101":                                               "--http 127.0.0.1:4321$i --join 127.0.0.1:43211",
		"/usr/bin/python3 python/examples/train.py --x 7070":                                         "/usr/bin/python3 " + pythonDir(t) + "/examples/train.py --x 7070",
		"echo make build; ls sbin/cachectl; kill $node":                                              "echo make build; ls sbin/cachectl; kill $node",
	} {
		if got := r.rewrite(in); got != want {
			t.Errorf("rewrite(%q)\n got %q\nwant %q", in, got, want)
		}
	}
}

type readmeRun struct {
	t       *testing.T
	tmp     string            // what /tmp/ becomes: empty again after the cleanup block
	cwd     string            // where bash runs: must stay empty
	scratch string            // the test's own files (the Python snippets saved)
	env     []string          // added to the test's environment
	ports   map[string]string // README port (or prefix) → the test's
	bash    *exec.Cmd
	stdin   io.WriteCloser
	exited  chan error // bash's exit
	gone    bool       // finish saw bash and everything it started exit
	log     string     // bash's and its children's stdout and stderr
}

func newReadmeRun(t *testing.T) *readmeRun {
	return &readmeRun{t: t, tmp: t.TempDir(), cwd: t.TempDir(), scratch: t.TempDir()}
}

const readmeDone = "README-BLOCKS-DONE"

// start runs script in a bash -e (a failing command fails the blocks) with
// pipefail, reading its commands from a pipe so that finish can add the
// cleanup block in the same shell, where $node and the like are still set.
// It returns the output once the script has run, failing the test if bash
// exits first or the script takes longer than timeout. Bash runs in a process
// group of its own: whatever it leaves running is killed when the test ends.
func (r *readmeRun) start(script string, timeout time.Duration) string {
	t := r.t
	t.Helper()
	r.log = filepath.Join(r.scratch, "out")
	// A file, not a pipe: the nodes in the background keep their copy of
	// it open after bash exits, and a pipe would hold Wait until they end.
	log, err := os.Create(r.log)
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	r.bash = exec.Command("bash")
	r.bash.Dir = r.cwd
	r.bash.Env = append(os.Environ(), r.env...)
	r.bash.Stdout, r.bash.Stderr = log, log
	r.bash.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if r.stdin, err = r.bash.StdinPipe(); err != nil {
		t.Fatal(err)
	}
	if err := r.bash.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := r.bash.Process.Pid
	r.exited = make(chan error, 1)
	go func() { r.exited <- r.bash.Wait() }()
	t.Cleanup(func() {
		if r.gone {
			return // the group's id may be another's by now
		}
		// SIGTERM: the nodes leave cleanly; then wait until the group is gone.
		_ = syscall.Kill(-pgid, syscall.SIGTERM)
		if !testutil.Within(testutil.Patience, func() bool { return syscall.Kill(-pgid, 0) == syscall.ESRCH }) {
			_ = syscall.Kill(-pgid, syscall.SIGKILL)
			testutil.Await(t, "the README blocks' processes to exit", func() bool { return syscall.Kill(-pgid, 0) == syscall.ESRCH })
		}
	})
	// Background commands of a non-interactive bash read /dev/null, not
	// this pipe; bash reads a pipe a byte at a time, leaving the rest for later.
	if _, err := io.WriteString(r.stdin, "set -eo pipefail\n"+script+"\necho "+readmeDone+"\n"); err != nil {
		t.Fatalf("writing the blocks to bash: %v\n%s", err, r.output())
	}
	var werr error
	exited := false
	if !testutil.Within(timeout, func() bool {
		select {
		case werr = <-r.exited:
			exited = true
			return true
		default:
			return strings.Contains(r.output(), "\n"+readmeDone+"\n")
		}
	}) {
		t.Fatalf("the README blocks still run after %v:\n--- script ---\n%s\n--- output ---\n%s", timeout, script, r.output())
	}
	if exited {
		t.Fatalf("the README blocks failed (bash: %v):\n--- script ---\n%s\n--- output ---\n%s", werr, script, r.output())
	}
	return r.output()
}

// finish runs the cleanup block in the shell start began, then checks that
// bash exits 0, that nothing it started is left running, and that the
// blocks' files are gone.
func (r *readmeRun) finish(cleanup string, timeout time.Duration) {
	t := r.t
	t.Helper()
	if _, err := io.WriteString(r.stdin, cleanup+"\nexit\n"); err != nil {
		t.Fatalf("writing the cleanup block to bash: %v", err)
	}
	r.stdin.Close()
	select {
	case err := <-r.exited:
		if err != nil {
			t.Fatalf("the cleanup block failed (bash: %v):\n--- block ---\n%s\n--- output ---\n%s", err, cleanup, r.output())
		}
	case <-time.After(timeout):
		t.Fatalf("the cleanup block still runs after %v:\n%s", timeout, r.output())
	}
	// The block waits for the nodes it stops: none is left once bash is gone.
	if err := syscall.Kill(-r.bash.Process.Pid, 0); err != syscall.ESRCH {
		t.Errorf("processes of the README blocks still run after the cleanup block (kill -0: %v)", err)
	} else {
		r.gone = true
	}
	for _, d := range []struct{ dir, what string }{
		{r.tmp, "the cleanup block left %q in /tmp"},
		{r.cwd, "the blocks wrote %q into the directory they ran in (in a checkout, it would stay there)"},
	} {
		if left, _ := os.ReadDir(d.dir); len(left) > 0 {
			t.Errorf(d.what, left[0].Name())
		}
	}
}

func (r *readmeRun) output() string {
	b, err := os.ReadFile(r.log)
	if err != nil {
		r.t.Fatal(err)
	}
	return string(b)
}

// readmeBlock is the n-th fenced block of lang under the heading whose text
// starts with heading (to the next heading of any level).
func readmeBlock(t *testing.T, md, heading, lang string, n int) string {
	t.Helper()
	var section []string
	in := false
	fence := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		if !fence && strings.HasPrefix(line, "#") {
			title := strings.TrimSpace(strings.TrimLeft(line, "#"))
			if in {
				break
			}
			in = strings.HasPrefix(title, heading)
			continue
		}
		if in {
			section = append(section, line)
		}
	}
	if !in {
		t.Fatalf("README.md has no heading %q", heading)
	}
	blocks := regexp.MustCompile("(?ms)^```"+regexp.QuoteMeta(lang)+"\n(.*?)^```$").FindAllStringSubmatch(strings.Join(section, "\n"), -1)
	if len(blocks) <= n {
		t.Fatalf("README.md, %q: %d %s blocks, want block %d", heading, len(blocks), lang, n)
	}
	return blocks[n][1]
}

func portOf(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

// freePortPrefix is a 4-digit prefix P whose ports P1, P2 and P3 are free
// now, for the README's 127.0.0.1:710$i.
func freePortPrefix(t *testing.T) string {
	t.Helper()
	for range 1000 {
		// Ports 20001..32763: below the kernel's ephemeral range, where an
		// outgoing connection could take one before the node binds it (see
		// testutil.FreeAddrOn).
		// Each port is reserved as testutil.FreeAddr's are, so that no
		// other test is handed it meanwhile; a prefix found wanting keeps
		// the ones it reserved until the test ends, which costs nothing.
		p := 2000 + rand.IntN(1276)
		free := true
		for i := 1; i <= 3 && free; i++ {
			free = testutil.ReserveAddr(t, fmt.Sprintf("127.0.0.1:%d%d", p, i))
		}
		if free {
			return strconv.Itoa(p)
		}
	}
	t.Fatal("no port prefix with three free ports")
	return ""
}

var plainCtl struct {
	once sync.Once
	path string
	err  error
}

// plainCachectl is cachectl built without the race detector, once per run,
// beside the binaries TestMain built.
func plainCachectl(t *testing.T) string {
	t.Helper()
	plainCtl.once.Do(func() {
		dir := filepath.Join(binDir, "plain")
		build := exec.Command("go", "build", "-o", dir+"/", "stallfree/cmd/cachectl")
		build.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := build.CombinedOutput()
		if err != nil {
			plainCtl.err = fmt.Errorf("building cachectl: %w\n%s", err, out)
		}
		plainCtl.path = filepath.Join(dir, "cachectl")
	})
	if plainCtl.err != nil {
		t.Fatal(plainCtl.err)
	}
	return plainCtl.path
}

// pythonHas reports whether /usr/bin/python3, the README's interpreter,
// imports every module named.
func pythonHas(modules ...string) bool {
	return exec.Command("/usr/bin/python3", "-c", "import "+strings.Join(modules, ", ")).Run() == nil
}

func pythonDir(t *testing.T) string {
	t.Helper()
	d, err := filepath.Abs(filepath.Join("..", "python"))
	if err != nil {
		t.Fatal(err)
	}
	return d
}
