package discovery

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
)

type table map[string][]string

func (t table) LookupHost(_ context.Context, host string) ([]string, error) {
	if a, ok := t[host]; ok {
		return a, nil
	}
	return nil, errors.New("no such host")
}

func TestExpand(t *testing.T) {
	r := table{"svc": {"10.0.0.2", "10.0.0.1", "10.0.0.2"}, "other": {"10.0.0.1", "fe80::1", "junk"}}
	got, err := Expand(context.Background(), r, []string{"svc:7946", "10.0.0.9:1", "other:7946", "missing:7946", "noport"})
	want := []string{"10.0.0.2:7946", "10.0.0.1:7946", "10.0.0.9:1", "[fe80::1]:7946"}
	if !slices.Equal(got, want) {
		t.Fatalf("Expand = %v, want %v", got, want)
	}
	if err == nil {
		t.Fatal("an unresolvable seed and one without a port went unreported")
	}
	for _, s := range []string{"missing:7946", `"noport"`} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %s", err, s)
		}
	}
	if got, err := Expand(context.Background(), r, []string{"svc:1"}); err != nil || len(got) != 2 {
		t.Fatalf("Expand(svc:1) = %v, %v", got, err)
	}
}

func TestBootstrapsByOrdinal(t *testing.T) {
	for name, want := range map[string]bool{"stallfree-0": true, "stallfree-1": false, "a-b-12": false, "x-0": true} {
		if got, err := BootstrapsByOrdinal(name); err != nil || got != want {
			t.Errorf("BootstrapsByOrdinal(%q) = %v, %v; want %v", name, got, err, want)
		}
	}
	for _, name := range []string{"stallfree", "stallfree-", "-0", "stallfree-00", "stallfree-x", "node1"} {
		if _, err := BootstrapsByOrdinal(name); err == nil {
			t.Errorf("BootstrapsByOrdinal(%q) accepted a name without an ordinal", name)
		}
	}
}
