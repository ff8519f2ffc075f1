package split

import (
	"context"
	"log/slog"
	"time"

	"stallfree/api"
)

// Target is what Auto plans for: the node.
type Target interface {
	// EpochsDone is how many epochs every reporting job has completed (the
	// least among them); it grows as the slowest job ends an epoch.
	EpochsDone() uint64
	SplitPlan(ctx context.Context) (api.Plan, error)
	ApplySplit(ctx context.Context, p api.Plan) error
}

// AutoConfig says how often Auto plans and when it applies.
type AutoConfig struct {
	// Every is how many epochs (of the slowest job) pass between plans
	// (default 2: the epoch after a change refills the cache, so the one
	// after it is the first measured under the new split).
	Every uint64
	// MinSaving is the predicted saving a plan must bring to be applied
	// (default 0.05: the jobs' epochs, summed, 5% shorter).
	MinSaving float64
	// Poll is how often the epoch count is looked at (default 1 s).
	Poll time.Duration
	Log  *slog.Logger
}

// Auto re-plans every cfg.Every epochs and applies a plan only when it
// predicts more than cfg.MinSaving, until ctx ends. A plan that is not
// worth it changes nothing: quotas move only for a real gain, so measuring
// noise does not shuffle the cache back and forth.
func Auto(ctx context.Context, t Target, cfg AutoConfig) {
	if cfg.Every == 0 {
		cfg.Every = 2
	}
	if cfg.MinSaving <= 0 {
		cfg.MinSaving = 0.05
	}
	if cfg.Poll <= 0 {
		cfg.Poll = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	tick := time.NewTicker(cfg.Poll)
	defer tick.Stop()
	var planned uint64 // epochs done at the last plan
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		done := t.EpochsDone()
		if done < planned+cfg.Every {
			continue
		}
		planned = done
		p, err := t.SplitPlan(ctx)
		if err != nil {
			cfg.Log.Warn("auto-split: planning", "err", err)
			continue
		}
		if len(p.Jobs) == 0 || p.PredictedSaving <= cfg.MinSaving {
			cfg.Log.Debug("auto-split: keeping the split", "predicted_saving", p.PredictedSaving)
			continue
		}
		if err := t.ApplySplit(ctx, p); err != nil {
			cfg.Log.Warn("auto-split: applying", "err", err)
			continue
		}
		cfg.Log.Info("auto-split: applied", "split", p.Split, "predicted_saving", p.PredictedSaving, "epochs", done)
	}
}
