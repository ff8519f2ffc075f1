package integration

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"stallfree/internal/testutil"
)

// The Grafana dashboard (deploy/grafana) and the alert rules
// (deploy/prometheus) name only metrics a running node exports, and the
// rules pass promtool. The nodes run with a cluster key, a persisted
// checkpoint and a warm-up, so every series the files use is there.
func TestDashboardAndRulesMatchTheMetrics(t *testing.T) {
	testutil.Long(t)
	nodes := startCluster(t, clusterOpts{nodes: 2, key: "dashboard-test-key-0123456789abcdef",
		extra: []string{"--checkpoint-memory", "8MiB", "--checkpoint-persist", "dir://" + t.TempDir()}})
	n1 := nodes[0]
	dir, _ := dataset(t, 8, 100)
	if code, body, _ := ckReq(t, n1, http.MethodPut, "/v1/datasets/ds", strings.NewReader(`{"source":"`+dir+`"}`), nil); code/100 != 2 {
		t.Fatalf("register: %d %s", code, body)
	}
	if code, body, _ := ckReq(t, n1, http.MethodPost, "/v1/datasets/ds/warmup", nil, nil); code != http.StatusAccepted {
		t.Fatalf("warm-up: %d %s", code, body)
	}
	report := `{"seconds":0.5,"step_seconds":1.5,"batches":10,"items":320,"job":"train","rank":0}`
	if code, body, _ := ckReq(t, n1, http.MethodPost, "/v1/loader/wait", strings.NewReader(report), nil); code != http.StatusNoContent {
		t.Fatalf("report: %d %s", code, body)
	}
	part := randomBytes(7, 1000)
	mustPut(t, n1, "ck", 1, "0", part) // through the member-only internal routes (cluster key)
	if code, body := commitStep(t, n1, "ck", 1, "0"); code != http.StatusOK {
		t.Fatalf("commit: %d %s", code, body)
	}
	testutil.AwaitWithin(t, 30*time.Second, "the step persisted", func() bool {
		ck, ok := tryInfo(t, n1, "ck")
		return ok && len(ck.Steps) == 1 && ck.Steps[0].Persisted
	})
	_, metrics, _ := ckReq(t, n1, http.MethodGet, "/metrics", nil, nil)
	exported := map[string]bool{}
	for _, line := range strings.Split(string(metrics), "\n") {
		if name, ok := strings.CutPrefix(line, "# TYPE "); ok {
			exported[strings.Fields(name)[0]] = true
		}
	}
	used := regexp.MustCompile(`stallfree_[a-z_]+`)
	root := filepath.Join("..", "deploy")
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	b, err := os.ReadFile(filepath.Join(root, "grafana", "stallfree.json"))
	if err != nil || json.Unmarshal(b, &dash) != nil || len(dash.Panels) == 0 {
		t.Fatalf("the dashboard: %v", err)
	}
	for _, p := range dash.Panels {
		for _, tg := range p.Targets {
			for _, m := range used.FindAllString(tg.Expr, -1) {
				if !exported[m] {
					t.Errorf("panel %q queries %s, which the node does not export", p.Title, m)
				}
			}
		}
	}
	rules := filepath.Join(root, "prometheus", "stallfree-rules.yml")
	b, err = os.ReadFile(rules)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range used.FindAllString(string(b), -1) {
		if !exported[m] {
			t.Errorf("the rules use %s, which the node does not export", m)
		}
	}
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not installed (Debian: prometheus; make test-deps installs it): rules not checked")
	}
	if out, err := exec.Command(promtool, "check", "rules", rules).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}
