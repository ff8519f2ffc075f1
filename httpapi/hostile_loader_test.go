package httpapi

import (
	"encoding/json"
	"strings"
	"testing"
)

// Loader reports (POST /v1/loader/wait) from hostile or careless callers:
// names follow the rules for job names, ranks stay within a world size, and
// nothing refused reaches the plan.
func TestLoaderReportsKeepToTheRules(t *testing.T) {
	h := start(t, 2, 10, 1<<20, "lru", "")
	for name, body := range map[string]string{
		"a 900 KB job name":       `{"seconds":1,"batches":1,"job":"` + strings.Repeat("j", 900<<10) + `"}`,
		"a job name with a slash": `{"seconds":1,"batches":1,"job":"a/b"}`,
		"a control character":     `{"seconds":1,"batches":1,"job":"a\u001b[2J"}`,
		"a negative rank":         `{"seconds":1,"batches":1,"job":"j","rank":-1}`,
		"a rank past any world":   `{"seconds":1,"batches":1,"job":"j","rank":100000}`,
		"a bad dataset name":      `{"seconds":1,"batches":1,"job":"j","dataset":"../x"}`,
	} {
		if r := h.do("POST", "/v1/loader/wait", []byte(body)); r.status >= 200 && r.status < 300 {
			t.Errorf("%s: %d %s", name, r.status, r.body)
		}
	}
	if r := h.do("POST", "/v1/loader/wait", []byte(`{"seconds":1,"batches":2,"job":"good-job","rank":3}`)); r.status != 204 {
		t.Fatalf("a good report: %d %s", r.status, r.body)
	}
	var plan struct {
		Jobs []struct {
			Job string `json:"job"`
		} `json:"jobs"`
	}
	r := h.do("GET", "/v1/plan", nil)
	if err := json.Unmarshal(r.body, &plan); err != nil {
		t.Fatalf("plan: %v %s", err, r.body)
	}
	for _, j := range plan.Jobs {
		if j.Job != "good-job" {
			t.Fatalf("a refused report reached the plan: job %.40q", j.Job)
		}
	}
}
