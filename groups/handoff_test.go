package groups

import (
	"bytes"
	"errors"
	"os"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/handoff"
	"stallfree/internal/testutil"
)

// handOver is a producer's batch handed over: a memfd holding data, taken
// by this process as the node takes a job's. It returns the file and its
// inode.
func handOver(t *testing.T, data []byte) (*handoff.File, uint64) {
	t.Helper()
	w, ino := testutil.Memfd(t, data, unix.MFD_ALLOW_SEALING)
	defer w.Close() // the producer lets go once the node has it
	f, err := handoff.Take(os.Getpid(), int(w.Fd()), ino, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return f, ino
}

// opens reports whether path still opens the file with inode ino.
func opens(path string, ino uint64) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	var st unix.Stat_t
	return unix.Fstat(int(f.Fd()), &st) == nil && st.Ino == ino
}

// A handed-over batch is staged as its own file, with no directory and
// nothing written by the service: readers get its path. The same bytes
// again, other bytes and a batch past the size bound are refused as sent
// bytes are, and each such file is let go at once; the staged one is let
// go when its linger ends.
func TestHandedOverBatches(t *testing.T) {
	h := newFakeHost(1 << 20)
	s := New(h, Config{Timeout: time.Hour, MaxBatchBytes: 64, Linger: time.Minute})
	t.Cleanup(s.Close)
	w := 4
	ctx := bounded(t)
	if _, _, err := s.Put(ctx, "g", api.GroupSpec{Dataset: "ds", Seed: 1, BatchSize: 4, Jobs: 2, Window: &w}); err != nil {
		t.Fatal(err)
	}
	data := []byte("a batch its producer wrote")
	b := Batch{Group: "g", Job: 0, Index: 0}
	f, ino := handOver(t, data)
	if created, err := s.PutHandedOver(ctx, b, f, time.Second); err != nil || !created {
		t.Fatalf("handed over: %v %v", created, err)
	}
	again, againIno := handOver(t, data)
	if created, err := s.PutHandedOver(ctx, b, again, time.Second); err != nil || created {
		t.Fatalf("the same bytes again: %v %v", created, err)
	}
	other, otherIno := handOver(t, []byte("other bytes"))
	if _, err := s.PutHandedOver(ctx, b, other, time.Second); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("other bytes: %v", err)
	}
	big, bigIno := handOver(t, bytes.Repeat([]byte("x"), 65))
	if _, err := s.PutHandedOver(ctx, Batch{Group: "g", Job: 0, Index: 1}, big, time.Second); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("65 bytes past a 64-byte bound: %v", err)
	}
	for name, l := range map[string]struct {
		path string
		ino  uint64
	}{"the same bytes": {again.Path, againIno}, "other bytes": {other.Path, otherIno}, "too large": {big.Path, bigIno}} {
		if opens(l.path, l.ino) {
			t.Errorf("%s: the refused file is still held", name)
		}
	}
	st, _, err := s.GetStaged(ctx, Batch{Group: "g", Job: 1, Index: 0}, 0)
	if err != nil || st.Path != f.Path || st.Data != nil || st.Size != int64(len(data)) {
		t.Fatalf("staged: %+v %v; want the handed-over file %s", st, err, f.Path)
	}
	if got, err := st.Bytes(); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("the staged batch reads %q, %v", got, err)
	}
	if info, _ := s.LocalInfo("g"); info.StagedBatches != 0 || h.held() != 0 {
		t.Fatalf("after both jobs: %d staged, %d bytes claimed", info.StagedBatches, h.held())
	}
	s.tick(time.Now())
	if !opens(st.Path, ino) {
		t.Fatal("the file was let go before its linger")
	}
	s.tick(time.Now().Add(2 * time.Minute))
	if opens(st.Path, ino) {
		t.Fatal("the file is held past its linger")
	}
}
