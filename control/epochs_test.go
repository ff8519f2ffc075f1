package control

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"stallfree/locality"
	"stallfree/source"
)

// The plan cache keeps the last MaxPlans plans, each once.
func TestPlanCacheBound(t *testing.T) {
	var p plans
	ep := &locality.EpochPlan{}
	for e := range uint64(MaxPlans + 1) {
		p.put(planKey{"j", 1, e}, ep)
		p.put(planKey{"j", 1, e}, ep)
	}
	if _, ok := p.get(planKey{"j", 1, 0}); ok {
		t.Fatal("the oldest plan outlived the bound")
	}
	for e := uint64(1); e <= MaxPlans; e++ {
		if _, ok := p.get(planKey{"j", 1, e}); !ok {
			t.Fatalf("plan of epoch %d dropped", e)
		}
	}
	if len(p.order) != MaxPlans || len(p.m) != MaxPlans {
		t.Fatalf("%d keys in order, %d plans: want %d each", len(p.order), len(p.m), MaxPlans)
	}
}

// Storage's own answers pass through with their status; anything else is
// the request's fault.
func TestStorageFault(t *testing.T) {
	for _, err := range []error{source.ErrDenied, source.ErrNotFound, source.ErrUnavailable, context.DeadlineExceeded} {
		if !storageFault(fmt.Errorf("listing: %w", err)) {
			t.Fatalf("%v is storage's answer", err)
		}
	}
	if storageFault(errors.New("no such scheme")) || storageFault(context.Canceled) {
		t.Fatal("a request's own fault counted as storage's")
	}
}
