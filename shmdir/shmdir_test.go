package shmdir

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Create gives a new 0600 file each time under the name asked for;
// RemoveStale removes exactly the files of its prefix.
func TestCreateAndRemoveStale(t *testing.T) {
	dir := t.TempDir()
	seen := map[string]bool{}
	for range 3 {
		f, err := Create(dir, "stallfree-a-t-")
		if err != nil {
			t.Fatal(err)
		}
		fi, _ := f.Stat()
		if seen[f.Name()] || !strings.HasPrefix(filepath.Base(f.Name()), "stallfree-a-t-") || fi.Mode().Perm() != 0o600 {
			t.Fatalf("created %s (mode %v), seen before: %v", f.Name(), fi.Mode().Perm(), seen[f.Name()])
		}
		seen[f.Name()] = true
		f.Close()
	}
	other := filepath.Join(dir, "stallfree-ckpt-a-t-x")
	if err := os.WriteFile(other, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if n := RemoveStale(dir, "stallfree-a-t-"); n != 3 {
		t.Fatalf("removed %d, want 3", n)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 1 || left[0] != other {
		t.Fatalf("left %v, want only %s", left, other)
	}
}
