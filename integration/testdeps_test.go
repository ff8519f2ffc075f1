package integration

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Issue 47: scripts/test-deps.sh waits for the dpkg lock (another apt run
// holds it for minutes on a fresh VM) instead of failing in seconds: both of
// its apt-get calls carry DPkg::Lock::Timeout. apt-get and dpkg are fakes
// here: the first records its arguments, the second says nothing is
// installed. As root the script runs the command; otherwise it prints it.
func TestTestDepsWaitsForTheDpkgLock(t *testing.T) {
	bin := t.TempDir()
	calls := filepath.Join(t.TempDir(), "apt-get.calls")
	fakes := map[string]string{
		"apt-get": "#!/bin/sh\necho \"$*\" >> " + calls + "\n",
		"dpkg":    "#!/bin/sh\nexit 1\n",
	}
	for name, script := range fakes {
		if err := os.WriteFile(filepath.Join(bin, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("bash", "../scripts/test-deps.sh", "python3", "some-package")
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	out, err := cmd.CombinedOutput()
	var said string
	if os.Geteuid() == 0 {
		if err != nil {
			t.Fatalf("test-deps.sh as root: %v\n%s", err, out)
		}
		b, err := os.ReadFile(calls)
		if err != nil {
			t.Fatalf("apt-get was not run: %v\n%s", err, out)
		}
		said = string(b)
	} else {
		said = string(out) // the command it asks the user to run
	}
	lines := 0
	for line := range strings.Lines(said) {
		if strings.Contains(line, "update") || strings.Contains(line, "install") {
			lines++
			if !strings.Contains(line, "-o DPkg::Lock::Timeout=600") {
				t.Errorf("apt-get without waiting for the dpkg lock: %q", line)
			}
		}
	}
	if lines == 0 {
		t.Fatalf("no apt-get update or install in %q", said)
	}
}
