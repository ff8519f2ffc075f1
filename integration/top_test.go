package integration

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/creack/pty"

	"stallfree/api"
	"stallfree/internal/testutil"
)

// Seeing the stall, end to end on real nodes: a two-rank job on 3 nodes,
// rank 1 slowed on purpose (step time 4x rank 0's), its stall meters
// reporting to two different nodes. The third node's GET /v1/jobs/{job},
// the reporting node's /metrics and `cachectl top` in a pseudo-terminal all
// show rank 1 as the straggler, with the wait shares the ranks reported.
func TestStragglerShowsEverywhere(t *testing.T) {
	testutil.Long(t)
	nodes := startCluster(t, clusterOpts{nodes: 3})
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	dir, _ := dataset(t, 4, 100)
	if code, body, _ := ckReq(t, n1, http.MethodPut, "/v1/datasets/ds", strings.NewReader(`{"source":"`+dir+`"}`), nil); code/100 != 2 {
		t.Fatalf("register: %d %s", code, body)
	}
	job := `{"dataset":"ds","seed":1,"world_size":2,"batch_size":32,"ranks":["n1","n2"]}`
	if code, body, _ := ckReq(t, n1, http.MethodPut, "/v1/jobs/train", strings.NewReader(job), nil); code/100 != 2 {
		t.Fatalf("job: %d %s", code, body)
	}
	// What each rank's meter measured: 10 batches of 32, waiting 0.5 s in all.
	ranks := []struct {
		node        *proc
		wait, stepS float64
	}{{n1, 0.5, 1.0}, {n2, 0.5, 4.0}}
	for r, rk := range ranks {
		rep := fmt.Sprintf(`{"seconds":%g,"step_seconds":%g,"batches":10,"items":320,"job":"train","rank":%d}`, rk.wait, rk.stepS, r)
		if code, body, _ := ckReq(t, rk.node, http.MethodPost, "/v1/loader/wait", strings.NewReader(rep), nil); code != http.StatusNoContent {
			t.Fatalf("rank %d's report: %d %s", r, code, body)
		}
	}
	var info api.JobInfo
	testutil.AwaitWithin(t, 10*time.Second, "both ranks in n3's view", func() bool {
		_, body, _ := ckReq(t, n3, http.MethodGet, "/v1/jobs/train", nil, nil)
		return json.Unmarshal(body, &info) == nil && len(info.Stall) == 2
	})
	for r, rk := range ranks {
		got := info.Stall[r]
		want := rk.wait / (rk.wait + rk.stepS)
		if got.Rank != r || got.Node != rk.node.name || got.Straggler != (r == 1) || got.WaitShare < want-0.05 || got.WaitShare > want+0.05 {
			t.Errorf("rank %d: %+v; want node %s, wait share %.2f, straggler %v", r, got, rk.node.name, want, r == 1)
		}
	}
	if _, metrics, _ := ckReq(t, n2, http.MethodGet, "/metrics", nil, nil); !bytes.Contains(metrics, []byte(`stallfree_rank_straggler{job="train",rank="1"} 1`)) {
		t.Errorf("n2's /metrics does not mark rank 1:\n%s", grepLines(metrics, "stallfree_rank_"))
	}

	// cachectl top in a pseudo-terminal: the screen shows the straggler; q quits.
	cmd := exec.Command(filepath.Join(binDir, "cachectl"), "--node", "http://"+n3.http, "top")
	cmd.Env = append(cmd.Environ(), "TERM=xterm")
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 50, Cols: 160})
	if err != nil {
		t.Fatal(err)
	}
	defer tty.Close()
	var (
		mu     sync.Mutex
		screen bytes.Buffer
	)
	go io.Copy(lockedWriter{&mu, &screen}, tty)
	// The screen as the terminal shows it: tcell redraws only the cells that
	// changed, positioning the cursor between them, so the byte stream of
	// a later frame need not hold a row's text in one piece.
	seen := func(re *regexp.Regexp) bool {
		mu.Lock()
		defer mu.Unlock()
		return re.Match(render(screen.Bytes(), 50, 160))
	}
	testutil.AwaitWithin(t, 20*time.Second, "the straggler on cachectl top's screen", func() bool {
		return seen(regexp.MustCompile(`train\s+1\s+n2\s+\S+\s+11%.*STRAGGLER`)) && seen(regexp.MustCompile(`train\s+0\s+n1\s+\S+\s+33%`))
	})
	tty.Write([]byte("q"))
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("cachectl top after q: %v", err)
		}
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatal("cachectl top did not quit on q")
	}

	// Off a terminal: one snapshot as plain text, then exit.
	out, err := exec.Command(filepath.Join(binDir, "cachectl"), "--node", "http://"+n1.http, "top").Output()
	if err != nil || !regexp.MustCompile(`train\s+1\s+n2\s+#+\.+\s+11%.*STRAGGLER`).Match(out) || bytes.Contains(out, []byte("\x1b")) {
		t.Fatalf("top off a terminal: %v\n%s", err, out)
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// ansi matches terminal escape sequences (CSI and the two-byte forms).
var ansi = regexp.MustCompile(`\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>78]`)

func stripANSI(b []byte) []byte { return ansi.ReplaceAll(b, nil) }

// render plays a terminal's output onto a rows×cols screen and returns its
// text, one line a row: cursor positioning (CUP, the relative moves, CHA,
// VPA), erasing (ED, EL) and printable runes are applied, every other
// sequence (styles, modes) is ignored. Enough for tcell's output.
func render(b []byte, rows, cols int) []byte {
	grid := make([][]rune, rows)
	clear := func(y, from int) {
		for x := from; x < cols; x++ {
			grid[y][x] = ' '
		}
	}
	for y := range grid {
		grid[y] = make([]rune, cols)
		clear(y, 0)
	}
	x, y := 0, 0
	clamp := func() { x, y = min(max(x, 0), cols-1), min(max(y, 0), rows-1) }
	for i := 0; i < len(b); {
		if b[i] == 0x1b {
			loc := ansi.FindIndex(b[i:])
			if loc == nil || loc[0] != 0 {
				i++
				continue
			}
			seq := string(b[i : i+loc[1]])
			i += loc[1]
			if len(seq) < 3 || seq[1] != '[' || strings.Contains(seq, "?") {
				continue
			}
			var n []int
			for _, f := range strings.Split(seq[2:len(seq)-1], ";") {
				v, _ := strconv.Atoi(f)
				n = append(n, v)
			}
			arg := func(k, def int) int {
				if k < len(n) && n[k] > 0 {
					return n[k]
				}
				return def
			}
			switch seq[len(seq)-1] {
			case 'H', 'f':
				y, x = arg(0, 1)-1, arg(1, 1)-1
			case 'A':
				y -= arg(0, 1)
			case 'B':
				y += arg(0, 1)
			case 'C':
				x += arg(0, 1)
			case 'D':
				x -= arg(0, 1)
			case 'G':
				x = arg(0, 1) - 1
			case 'd':
				y = arg(0, 1) - 1
			case 'J':
				for r := range grid {
					if n[0] == 2 || r > y {
						clear(r, 0)
					}
				}
				if n[0] != 2 {
					clear(y, x)
				}
			case 'K':
				clear(y, x)
			}
			clamp()
			continue
		}
		r, size := utf8.DecodeRune(b[i:])
		i += size
		switch r {
		case '\r':
			x = 0
		case '\n':
			y++
		case '\b':
			x--
		default:
			if r >= ' ' {
				grid[y][x] = r
				x++
			}
		}
		clamp()
	}
	var out bytes.Buffer
	for _, row := range grid {
		out.WriteString(string(row))
		out.WriteByte('\n')
	}
	return out.Bytes()
}

func grepLines(b []byte, sub string) string {
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
