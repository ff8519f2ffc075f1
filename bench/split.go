package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// SplitResult is what `python -m stallfree.bench --split --record
// docs/bench/split.json` measured: two jobs at once under an equal split of
// the memory, then under the node's plan (docs/api.md). It lives beside
// results.json, so that `make bench` (which measures everything else)
// keeps it, and `sfbench -report` renders it.
type SplitResult struct {
	Command    string      `json:"command"`
	Date       string      `json:"date"`
	Load       [2]float64  `json:"load"` // 1-minute load average at the start and the end
	Memory     int64       `json:"memory"`
	Items      int         `json:"items"`
	ItemSize   int         `json:"item_size"`
	SourceRate int64       `json:"source_rate"`
	ComputeS   float64     `json:"compute_s"`
	Epochs     int         `json:"epochs"`
	ElapsedS   float64     `json:"elapsed_s"`
	Jobs       []SplitJob  `json:"jobs"`
	Goals      []SplitGoal `json:"goals"`
}

// SplitJob is one job's row.
type SplitJob struct {
	Job        string  `json:"job"`
	EqualS     float64 `json:"equal_s"`
	PlanS      float64 `json:"plan_s"`
	PredictedS float64 `json:"predicted_s"`
	Error      float64 `json:"prediction_error"`
	Speedup    float64 `json:"speedup"`
	QuotaEqual int64   `json:"quota_equal"`
	QuotaPlan  int64   `json:"quota_plan"`
	// The epoch's parts, per split: the wait is what the split changes; the
	// step (a sleep standing for the GPU) only stretches when a loaded
	// machine wakes the job late.
	WaitEqualS float64 `json:"wait_equal_s"`
	WaitPlanS  float64 `json:"wait_plan_s"`
	StepEqualS float64 `json:"step_equal_s"`
	StepPlanS  float64 `json:"step_plan_s"`
}

// SplitGoal is a goal of the issue and whether the run met it.
type SplitGoal struct {
	Goal string `json:"goal"`
	Met  bool   `json:"met"`
}

// readSidecars fills what other benchmarks recorded beside results.json.
func readSidecars(rep *Report, dir string) error {
	b, err := os.ReadFile(filepath.Join(dir, "split.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	var s SplitResult
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("split.json: %w", err)
	}
	rep.Split = &s
	return nil
}

func splitSection(w func(string, ...any), s *SplitResult) {
	const mib = 1 << 20
	w("\n## Memory split by sensitivity: equal split against the plan\n\n")
	w("One node with %d MiB of memory; two datasets of %d items of %d KiB (%.0f MiB each, more than half the memory), each read\n",
		s.Memory/mib, s.Items, s.ItemSize>>10, float64(s.Items*s.ItemSize)/mib)
	w("from storage throttled to %.0f MiB/s; two jobs at once through the Python stack (threaded read-ahead loader, `StallMeter`):\n", float64(s.SourceRate)/mib)
	w("`io` computes nothing, `gpu` computes %.1f s an epoch. %d epochs under each split, the first of each left out (cold cache;\n", s.ComputeS, s.Epochs)
	w("a cache growing to its new quota); the plan was made from the equal split's reports and applied with `POST /v1/plan/apply`.\n")
	w("%s, %.0f s, load average %.1f at the start and %.1f at the end (the machine was shared):\n\n", s.Date, s.ElapsedS, s.Load[0], s.Load[1])
	w("    %s\n\n", s.Command)
	w("| job | equal split | plan | predicted | error | speedup | quota equal → plan |\n|---|---|---|---|---|---|---|\n")
	for _, j := range s.Jobs {
		w("| %s | %.2f s | %.2f s | %.2f s | %+.1f%% | %.2fx | %.1f → %.1f MiB |\n", j.Job, j.EqualS, j.PlanS, j.PredictedS, 100*j.Error,
			j.Speedup, float64(j.QuotaEqual)/mib, float64(j.QuotaPlan)/mib)
	}
	w("\nThe epochs' parts, equal split → plan, per epoch:")
	for _, j := range s.Jobs {
		w(" `%s` waited %.2f → %.2f s and stepped %.2f → %.2f s;", j.Job, j.WaitEqualS, j.WaitPlanS, j.StepEqualS, j.StepPlanS)
	}
	w("\nthe split changes the wait; a step is a sleep standing for the GPU, which stretches only when the loaded machine\n")
	w("wakes the job late.\n\n")
	for _, g := range s.Goals {
		met := "met"
		if !g.Met {
			met = "**not met**"
		}
		w("- %s: %s\n", g.Goal, met)
	}
}
