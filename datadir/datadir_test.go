package datadir

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestSecondHolderIsRefusedNamingDirAndPid(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	l, err := Acquire(dir)
	if err != nil {
		t.Fatal(err)
	}
	// flock locks open files, so a second open in this same process
	// conflicts just as another process's would.
	_, err = Acquire(dir)
	if !errors.Is(err, ErrInUse) {
		t.Fatalf("second Acquire: err %v, want ErrInUse", err)
	}
	for _, want := range []string{dir, fmt.Sprintf("pid %d", os.Getpid())} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l2, err := Acquire(dir)
	if err != nil {
		t.Fatalf("after Close: %v", err)
	}
	l2.Close()
}

// A holder killed without releasing leaves its pid in LOCK; the kernel has
// dropped its flock, so the next node starts.
func TestDeadHolderNeverBlocks(t *testing.T) {
	if os.Getenv("DATADIR_HOLD") != "" {
		if _, err := Acquire(os.Getenv("DATADIR_HOLD")); err != nil {
			fmt.Println("ERR", err)
			os.Exit(2)
		}
		fmt.Println("held")
		select {} // until killed
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestDeadHolderNeverBlocks$")
	cmd.Env = append(os.Environ(), "DATADIR_HOLD="+dir)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := out.Read(buf); err != nil || string(buf) != "held\n" {
		t.Fatalf("child: %q %v", buf, err)
	}
	if _, err := Acquire(dir); !errors.Is(err, ErrInUse) || !strings.Contains(err.Error(), fmt.Sprintf("pid %d", cmd.Process.Pid)) {
		t.Fatalf("while the child holds it: err %v, want ErrInUse naming pid %d", err, cmd.Process.Pid)
	}
	cmd.Process.Kill()
	cmd.Wait()
	b, _ := os.ReadFile(filepath.Join(dir, LockFile))
	if strings.TrimSpace(string(b)) != fmt.Sprint(cmd.Process.Pid) {
		t.Fatalf("LOCK holds %q, want the dead child's pid %d (the case under test)", b, cmd.Process.Pid)
	}
	l, err := Acquire(dir)
	if err != nil {
		t.Fatalf("after the holder died: %v", err)
	}
	l.Close()
}
