package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// --bootstrap-ordinal-zero refuses what would leave the decision to chance
// (no --join: every pod would form a cluster of its own) or contradict it,
// before the node creates, binds or joins anything; STALLFREE_BOOTSTRAP_ORDINAL_ZERO,
// as the StatefulSet sets it, means the same.
func TestBootstrapOrdinalZeroRefusesWhatItCannotDecide(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	base := []string{"--data-dir", dir, "--http", "127.0.0.1:0", "--peer", "127.0.0.1:0",
		"--gossip", "127.0.0.1:0", "--raft", "127.0.0.1:0"}
	for _, c := range []struct{ args, want string }{
		{"--bootstrap-ordinal-zero --bootstrap --name s-0 --join localhost:1", "give it or --bootstrap, not both"},
		{"--bootstrap-ordinal-zero --name s-0", "--bootstrap-ordinal-zero needs --join"},
		{"--bootstrap-ordinal-zero --name node1 --join localhost:1", `--name: name "node1" does not end in -ORDINAL`},
		{"--bootstrap-ordinal-zero --name s-01 --join localhost:1", `--name: name "s-01" does not end in -ORDINAL`},
	} {
		err := run(append(base, strings.Fields(c.args)...))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: err %v, want one saying %q", c.args, err, c.want)
		}
	}
	t.Setenv("STALLFREE_BOOTSTRAP_ORDINAL_ZERO", "true")
	if err := run(append(base, "--name", "cache", "--join", "localhost:1")); err == nil || !strings.Contains(err.Error(), "--bootstrap-ordinal-zero: --name") {
		t.Errorf("from the environment: err %v, want the ordinal refused", err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("refused flags left %s behind (stat: %v)", dir, err)
	}
}
