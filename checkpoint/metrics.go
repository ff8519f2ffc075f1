package checkpoint

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// stepClock remembers when this node first saw each committed step (its
// catalog applying the commit): the steps' ages come from it.
type stepClock struct {
	mu   sync.Mutex
	seen map[string]time.Time // "name/step"
}

func stepKey(name string, step uint64) string { return name + "/" + strconv.FormatUint(step, 10) }

// note records the committed steps not seen before, at now, and forgets
// the steps no longer committed.
func (c *stepClock) note(s *Service, now time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.seen == nil {
		c.seen = map[string]time.Time{}
	}
	live := map[string]bool{}
	for _, ck := range s.cat.Checkpoints() {
		for _, st := range ck.Steps {
			k := stepKey(ck.Name, st.Step)
			live[k] = true
			if _, ok := c.seen[k]; !ok {
				c.seen[k] = now
			}
		}
	}
	for k := range c.seen {
		if !live[k] {
			delete(c.seen, k)
		}
	}
}

func (c *stepClock) at(name string, step uint64) (time.Time, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	t, ok := c.seen[stepKey(name, step)]
	return t, ok
}

var (
	latestStepDesc = prometheus.NewDesc("stallfree_checkpoint_latest_step", "A checkpoint's newest committed step.",
		[]string{"checkpoint"}, nil)
	latestAgeDesc = prometheus.NewDesc("stallfree_checkpoint_latest_age_seconds",
		"Seconds since this node saw a checkpoint's newest step commit.", []string{"checkpoint"}, nil)
	unpersistedDesc = prometheus.NewDesc("stallfree_checkpoint_unpersisted_age_seconds",
		"Seconds the oldest committed step not yet persisted has waited (0: all persisted); only with --checkpoint-persist.",
		[]string{"checkpoint"}, nil)
)

// Describe and Collect make the service a prometheus.Collector: each
// checkpoint's newest step, its age, and how long a committed step has
// waited to be persisted (the "not persisted in 30 minutes" alert).
func (s *Service) Describe(ch chan<- *prometheus.Desc) {
	ch <- latestStepDesc
	ch <- latestAgeDesc
	ch <- unpersistedDesc
}

func (s *Service) Collect(ch chan<- prometheus.Metric) {
	now := time.Now()
	s.steps.note(s, now)
	for _, ck := range s.cat.Checkpoints() {
		l := ck.Latest()
		if l == nil {
			continue
		}
		ch <- prometheus.MustNewConstMetric(latestStepDesc, prometheus.GaugeValue, float64(l.Step), ck.Name)
		if t, ok := s.steps.at(ck.Name, l.Step); ok {
			ch <- prometheus.MustNewConstMetric(latestAgeDesc, prometheus.GaugeValue, now.Sub(t).Seconds(), ck.Name)
		}
		if s.persist == nil {
			continue
		}
		wait := 0.0
		for _, st := range ck.Steps {
			if t, ok := s.steps.at(ck.Name, st.Step); ok && !st.Persisted {
				wait = max(wait, now.Sub(t).Seconds())
			}
		}
		ch <- prometheus.MustNewConstMetric(unpersistedDesc, prometheus.GaugeValue, wait, ck.Name)
	}
}
