package catalog

import (
	"errors"
	"testing"
)

func TestCheckpointCommands(t *testing.T) {
	st := newState()
	part := func(sum string) []CheckpointPart {
		return []CheckpointPart{{Name: "0", Size: 3, Sum: sum, Holders: []string{"a", "b"}}}
	}
	commit := func(step uint64, sum string) any {
		return st.applyCheckpoint(step*10, &checkpointCmd{Op: ckptCommit, Name: "job", Step: step, Parts: part(sum), Keep: 2})
	}
	for _, step := range []uint64{1, 2} {
		if _, ok := commit(step, "s").(*CheckpointStep); !ok {
			t.Fatalf("commit %d refused", step)
		}
	}
	if _, ok := commit(2, "s").(*CheckpointStep); !ok {
		t.Fatal("a retried commit with the same parts is refused")
	}
	if err, _ := commit(2, "other").(error); !errors.Is(err, ErrConflict) {
		t.Fatalf("a committed step recommitted with other parts: %v", err)
	}
	if err, _ := commit(1, "s").(error); err != nil {
		t.Fatalf("retrying step 1: %v", err)
	}
	before := st.Checkpoints["job"]
	commit(3, "s")
	ck := st.Checkpoints["job"]
	if len(ck.Steps) != 2 || ck.Steps[0].Step != 2 || ck.Latest().Step != 3 {
		t.Fatalf("keep 2 after step 3: %+v", ck.Steps)
	}
	if len(before.Steps) != 2 || before.Steps[0].Step != 1 {
		t.Fatal("a published checkpoint was changed in place")
	}
	if err, _ := commit(1, "s").(error); !errors.Is(err, ErrConflict) {
		t.Fatalf("a step older than the latest: %v", err)
	}
	if _, ok := st.applyCheckpoint(40, &checkpointCmd{Op: ckptPersisted, Name: "job", Step: 3}).(*CheckpointStep); !ok {
		t.Fatal("persisted mark refused")
	}
	st.applyCheckpoint(41, &checkpointCmd{Op: ckptHolders, Name: "job", Step: 3,
		Parts: []CheckpointPart{{Name: "0", Sum: "s", Holders: []string{"a", "c"}}}})
	s3, _ := st.Checkpoints["job"].Step(3)
	if !s3.Persisted || s3.Parts[0].Holders[1] != "c" {
		t.Fatalf("step 3 after persist and repair: %+v", s3)
	}
	if st.applyCheckpoint(42, &checkpointCmd{Op: ckptDelete, Name: "job"}) != nil || st.Checkpoints["job"] != nil {
		t.Fatal("delete")
	}
	if err, _ := st.applyCheckpoint(43, &checkpointCmd{Op: ckptDelete, Name: "job"}).(error); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleting twice: %v", err)
	}
}

// A persisted mark names the commit whose bytes were persisted: a step
// deleted and committed again under its number while the old one was being
// persisted is another commit, and the late mark must not land on it (the
// third attack round: the new step read "persisted" over the old bytes, and
// was never persisted again). A mark without a version (older log entries)
// marks the step as before.
func TestPersistedMarkIsOfItsCommit(t *testing.T) {
	st := newState()
	commit := func(index uint64, sum string) *CheckpointStep {
		s, _ := st.applyCheckpoint(index, &checkpointCmd{Op: ckptCommit, Name: "cq", Step: 7,
			Parts: []CheckpointPart{{Name: "0", Size: 3, Sum: sum, Holders: []string{"a", "b"}}}, Keep: 2}).(*CheckpointStep)
		return s
	}
	old := commit(10, "old")
	if st.applyCheckpoint(11, &checkpointCmd{Op: ckptDelete, Name: "cq"}) != nil {
		t.Fatal("delete")
	}
	fresh := commit(12, "new")
	if old == nil || fresh == nil || old.Version == fresh.Version {
		t.Fatalf("commits %+v and %+v", old, fresh)
	}
	mark := func(index, version uint64) any {
		return st.applyCheckpoint(index, &checkpointCmd{Op: ckptPersisted, Name: "cq", Step: 7, Version: version})
	}
	if err, _ := mark(13, old.Version).(error); !errors.Is(err, ErrConflict) {
		t.Fatalf("the deleted commit's mark on its successor: %v; want a conflict", err)
	}
	if s, _ := st.Checkpoints["cq"].Step(7); s.Persisted {
		t.Fatal("the new commit was marked persisted with the old one's bytes")
	}
	if _, ok := mark(14, fresh.Version).(*CheckpointStep); !ok {
		t.Fatal("its own mark refused")
	}
	if s, _ := st.Checkpoints["cq"].Step(7); !s.Persisted {
		t.Fatal("its own mark did not take")
	}
	if _, ok := mark(15, 0).(*CheckpointStep); !ok {
		t.Fatal("a mark from before versions refused")
	}
}
