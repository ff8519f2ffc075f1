package checkpoint

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"stallfree/catalog"
	"stallfree/relay"
	"stallfree/shmdir"
)

// stepCatalog is a catalog whose committed steps a test sets.
type stepCatalog struct {
	Catalog
	mu        sync.Mutex
	ck        map[string]*catalog.Checkpoint
	persisted []uint64
}

func (c *stepCatalog) Checkpoint(name string) (*catalog.Checkpoint, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ck, ok := c.ck[name]
	return ck, ok
}

// commit records step of name as committed with these parts (one holder).
func (c *stepCatalog) commit(name string, step uint64, parts ...catalog.CheckpointPart) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ck == nil {
		c.ck = map[string]*catalog.Checkpoint{}
	}
	c.ck[name] = &catalog.Checkpoint{Name: name, Steps: []*catalog.CheckpointStep{{Step: step, Parts: parts, Version: 1}}}
}

func (c *stepCatalog) MarkCheckpointPersisted(_ string, step, _ uint64) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.persisted = append(c.persisted, step)
	return nil
}

// twoMembers are this node (a) and b, whose address answers nothing.
type twoMembers struct{}

func (twoMembers) Members() []string { return []string{"a", "b"} }
func (twoMembers) MemberHTTP(m string) (string, bool) {
	addr, ok := map[string]string{"a": "127.0.0.1:2", "b": "127.0.0.1:1"}[m]
	return addr, ok
}
func (twoMembers) LeaderHTTP() string { return "" }

func newTestService(t *testing.T, cat Catalog) *Service {
	t.Helper()
	s := &Service{cfg: Config{Self: "a"}, cat: cat, members: twoMembers{}, mem: newMemory(1 << 20),
		log: slog.New(slog.DiscardHandler), ctx: context.Background(), peers: relay.New("a", "")}
	t.Cleanup(s.mem.dropAll)
	return s
}

func putReplica(t *testing.T, s *Service, step uint64, part string, body io.Reader, b []byte) error {
	return s.Put(bounded(t), PutRequest{Name: "job", Step: step, Part: part, Sum: sum(b), Size: int64(len(b)), Replica: true}, body)
}

func localBytes(t *testing.T, s *Service, step uint64, part string) []byte {
	t.Helper()
	p, err := s.Open(context.Background(), "job", step, part, true)
	if err != nil {
		t.Fatalf("part %s: %v", part, err)
	}
	defer p.Close()
	b, err := io.ReadAll(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The attack of issue 46: a part's PUT starts, the step is committed while
// its body is still arriving, then the body ends. The committed bytes stay;
// the late body is refused as a conflict.
func TestCommitDuringABodyKeepsTheCommittedBytes(t *testing.T) {
	cat := &stepCatalog{}
	s := newTestService(t, cat)
	committed := bytes.Repeat([]byte("A"), 64<<10)
	late := bytes.Repeat([]byte("B"), 64<<10)
	if err := putReplica(t, s, 7, "0", bytes.NewReader(committed), committed); err != nil {
		t.Fatal(err)
	}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() { done <- putReplica(t, s, 7, "0", pr, late) }()
	pw.Write(late[:32<<10]) // the handler is reading this body now
	cat.commit("job", 7, catalog.CheckpointPart{Name: "0", Size: int64(len(committed)), Sum: sum(committed), Holders: []string{"a"}})
	pw.Write(late[32<<10:])
	pw.Close()
	if err := <-done; !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("a body finished after its step committed: %v; want a conflict", err)
	}
	if got := localBytes(t, s, 7, "0"); !bytes.Equal(got, committed) {
		t.Fatal("the committed part was rewritten")
	}
	if used, parts := s.mem.usage(); used != uint64(len(committed)) || parts != 1 {
		t.Fatalf("after the refusal: %d bytes in %d parts; want the committed part only", used, parts)
	}
	// The same bytes again are a repair's copy, still welcome.
	repair := PutRequest{Name: "job", Step: 7, Part: "0", Sum: sum(committed), Size: int64(len(committed)), Replica: true, Repair: true}
	if err := s.Put(bounded(t), repair, bytes.NewReader(committed)); err != nil {
		t.Fatalf("a repair's copy of the committed bytes: %v", err)
	}
	// A part the commit did not list cannot join the step.
	if err := putReplica(t, s, 7, "9", bytes.NewReader(late), late); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("a new part in a committed step: %v", err)
	}
}

// forgeCRC32C returns prefix and four bytes more, whose crc32c is target's:
// crc32c is linear, so anyone can match a part's sum with other bytes. The
// table is walked back from the target register to find the four table
// rows the appended bytes must select, then forward from prefix's register
// to find the bytes that select them.
func forgeCRC32C(prefix []byte, target uint32) []byte {
	table := crc32.MakeTable(crc32.Castagnoli)
	var rowOfTop [256]byte
	for i, v := range table {
		rowOfTop[v>>24] = byte(i)
	}
	var rows [4]byte
	x := ^target
	for i := 3; i >= 0; i-- {
		rows[i] = rowOfTop[x>>24]
		x = (x ^ table[rows[i]]) << 8
	}
	r := ^crc32.Checksum(prefix, table)
	out := append([]byte(nil), prefix...)
	for _, row := range rows {
		b := byte(r) ^ row
		out = append(out, b)
		r = r>>8 ^ table[row]
	}
	return out
}

// A part settled by a commit is never replaced, even by a body whose crc32c
// matches the committed one: the attack of stop 57 started such a body
// before the commit and finished it after, and the late bytes were served.
func TestSettledPartKeepsItsBytesAgainstAForgedSum(t *testing.T) {
	cat := &stepCatalog{}
	s := newTestService(t, cat)
	committed := bytes.Repeat([]byte("A"), 64<<10)
	crc := crc32.Checksum(committed, crc32.MakeTable(crc32.Castagnoli))
	forged := forgeCRC32C(bytes.Repeat([]byte("B"), 64<<10-4), crc)
	if got := crc32.Checksum(forged, crc32.MakeTable(crc32.Castagnoli)); got != crc || len(forged) != len(committed) {
		t.Fatalf("forged %08x over %d bytes; want %08x over %d", got, len(forged), crc, len(committed))
	}
	sumOf := fmt.Sprintf("crc32c:%08x", crc)
	put := func(body []byte, repair bool) error {
		return s.Put(bounded(t), PutRequest{Name: "job", Step: 7, Part: "0", Sum: sumOf, Size: int64(len(body)),
			Replica: true, Repair: repair}, bytes.NewReader(body))
	}
	if err := put(committed, false); err != nil {
		t.Fatal(err)
	}
	// Before any commit a part's last writer wins, forged or not.
	if err := put(forged, false); err != nil {
		t.Fatalf("replacing an unsettled part: %v", err)
	}
	if err := put(committed, false); err != nil {
		t.Fatal(err)
	}
	held, _ := s.mem.get(partKey{"job", 7, "0"})
	held.release()
	s.Held("job", 7, true) // a commit counts it
	if err := put(forged, false); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("forged bytes over a counted part: %v; want a conflict", err)
	}
	cat.commit("job", 7, catalog.CheckpointPart{Name: "0", Size: int64(len(committed)), Sum: sumOf, Holders: []string{"a"}})
	if err := put(forged, true); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("a forged repair of a committed part: %v; want a conflict", err)
	}
	if got := localBytes(t, s, 7, "0"); !bytes.Equal(got, committed) {
		t.Fatal("the settled part was rewritten by bytes of the same sum")
	}
	// The same bytes again change nothing: the held buffer stays, the new one
	// goes back.
	if err := put(committed, true); err != nil {
		t.Fatalf("a repair's copy of the committed bytes: %v", err)
	}
	now, _ := s.mem.get(partKey{"job", 7, "0"})
	now.release()
	if now != held {
		t.Fatal("an equal copy replaced the held part")
	}
	if used, parts := s.mem.usage(); used != uint64(len(committed)) || parts != 1 {
		t.Fatalf("after the refusals and the equal copy: %d bytes in %d parts; want the committed part only", used, parts)
	}
	// A copy this node lost is repaired from bytes of the committed sum.
	s.mem.drop(func(partKey) bool { return true })
	if err := put(committed, true); err != nil {
		t.Fatalf("repairing a lost copy: %v", err)
	}
	if got := localBytes(t, s, 7, "0"); !bytes.Equal(got, committed) {
		t.Fatal("the repaired copy differs")
	}
}

// A store over a stale copy (another sum than the committed one) replaces
// it: that is how a repair mends a copy a bug left.
func TestSettledStoreReplacesAStaleCopy(t *testing.T) {
	m := newMemory(1 << 20)
	t.Cleanup(m.dropAll)
	k := partKey{"job", 1, "0"}
	notSettled := func(partKey) (string, bool) { return "", false }
	committed := func(partKey) (string, bool) { return "good", true }
	stale, _ := m.reserve(4)
	copy(stale, "old!")
	if err := m.store(k, stale, "bad", notSettled); err != nil {
		t.Fatal(err)
	}
	good, _ := m.reserve(4)
	copy(good, "new!")
	if err := m.store(k, good, "good", committed); err != nil {
		t.Fatalf("the committed bytes over a stale copy: %v", err)
	}
	h, _ := m.get(k)
	defer h.release()
	if string(h.data) != "new!" || h.sum != "good" {
		t.Fatalf("held %q (%s); want the committed bytes", h.data, h.sum)
	}
	if used, parts := m.usage(); used != 4 || parts != 1 {
		t.Fatalf("%d bytes in %d parts; the stale copy's memory was not given back", used, parts)
	}
}

// Between a commit's count (the leader asking each node what it holds) and
// the commit reaching this node's catalog, the counted bytes are the only
// ones a part may hold. A plain listing counts nothing.
func TestCountedPartsKeepTheirBytes(t *testing.T) {
	s := newTestService(t, &stepCatalog{})
	a, b := []byte("first version"), []byte("other version")
	for _, part := range []string{"0", "1"} {
		if err := putReplica(t, s, 3, part, bytes.NewReader(a), a); err != nil {
			t.Fatal(err)
		}
	}
	if got := s.Held("job", 3, false); len(got) != 2 {
		t.Fatalf("held: %v", got)
	}
	if err := putReplica(t, s, 3, "1", bytes.NewReader(b), b); err != nil {
		t.Fatalf("replacing a part no commit counted: %v", err)
	}
	s.Held("job", 3, true)
	if err := putReplica(t, s, 3, "0", bytes.NewReader(b), b); !errors.Is(err, catalog.ErrConflict) {
		t.Fatalf("replacing a counted part: %v", err)
	}
	if got := localBytes(t, s, 3, "0"); !bytes.Equal(got, a) {
		t.Fatalf("counted part holds %q", got)
	}
	if err := putReplica(t, s, 3, "1", bytes.NewReader(b), b); err != nil {
		t.Fatalf("the counted bytes again: %v", err)
	}
}

// A listing of a step nobody holds is an empty JSON array, not null.
func TestHeldListsNoneAsEmpty(t *testing.T) {
	s := newTestService(t, &stepCatalog{})
	b, err := json.Marshal(s.Held("nothing", 1, false))
	if err != nil || string(b) != "[]" {
		t.Fatalf("held of nothing: %s %v", b, err)
	}
}

// A copy that differs from its committed part (left by a bug, or a
// corrupt node) is dropped the first time it is met, reported once, and
// never served or copied on.
func TestBadCopyIsDroppedOnceAndNeverServed(t *testing.T) {
	cat := &stepCatalog{}
	s := newTestService(t, cat)
	good, bad := []byte("the committed bytes"), []byte("some other bytes!!!")
	if err := putReplica(t, s, 5, "0", bytes.NewReader(bad), bad); err != nil {
		t.Fatal(err)
	}
	cat.commit("job", 5, catalog.CheckpointPart{Name: "0", Size: int64(len(good)), Sum: sum(good), Holders: []string{"a", "b"}})
	if err := s.CopyTo(context.Background(), "job", 5, "0", "127.0.0.1:1"); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("copying a bad copy on: %v", err)
	}
	if err := s.CopyTo(context.Background(), "job", 5, "0", "169.254.169.254:80"); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a copy to an address no member has: %v", err)
	}
	for range 2 {
		if _, err := s.Open(context.Background(), "job", 5, "0", false); err == nil {
			t.Fatal("a copy that is not the committed part was served")
		}
	}
	if n := s.Stats().DroppedCopies; n != 1 {
		t.Fatalf("dropped copies reported %d times; want once", n)
	}
	if _, parts := s.mem.usage(); parts != 0 {
		t.Fatalf("%d parts held after the drop", parts)
	}
}

// Persisting hashes this node's copy as it writes it: bytes that no longer
// match the committed sum leave no persisted object and no persisted mark.
func TestPersistWritesOnlyTheCommittedBytes(t *testing.T) {
	cat := &stepCatalog{}
	s := newTestService(t, cat)
	root := t.TempDir()
	s.persist = dirBackend{root: root}
	body := bytes.Repeat([]byte("ckpt"), 4096)
	if err := putReplica(t, s, 2, "0", bytes.NewReader(body), body); err != nil {
		t.Fatal(err)
	}
	part := catalog.CheckpointPart{Name: "0", Size: int64(len(body)), Sum: sum(body), Holders: []string{"a"}}
	cat.commit("job", 2, part)
	st, _ := cat.ck["job"].Step(2)

	h, _ := s.mem.get(partKey{"job", 2, "0"})
	h.data[100] ^= 0xff // the memory under the label went bad
	err := s.persistStep("job", st)
	if !errors.Is(err, errSum) {
		t.Fatalf("persisting corrupt bytes: %v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "job", "2", "0")); !os.IsNotExist(err) {
		t.Fatalf("a persisted object of corrupt bytes: %v", err)
	}
	h.data[100] ^= 0xff
	h.release()
	if len(cat.persisted) != 0 {
		t.Fatal("the step was marked persisted")
	}
	if err := s.persistStep("job", st); err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(root, "job", "2", "0"))
	if err != nil || !bytes.Equal(got, body) || len(cat.persisted) != 1 {
		t.Fatalf("persisted %d bytes (err %v), marks %v", len(got), err, cat.persisted)
	}
}

// stalledBody answers 0, nil forever: a reader that neither delivers nor
// ends.
type stalledBody struct{}

func (stalledBody) Read([]byte) (int, error) { return 0, nil }

// A body that stalls without ending is given up when the request's context
// ends, and keeps nothing: the loop does not outlive its client.
func TestPutEndsWithItsContext(t *testing.T) {
	s := newTestService(t, &stepCatalog{})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- s.Put(ctx, PutRequest{Name: "job", Step: 1, Part: "0", Sum: sum([]byte("x")), Size: 1, Replica: true}, stalledBody{})
	}()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, context.Canceled) {
			t.Fatalf("a stalled body after its context ended: %v", err)
		}
	case <-bounded(t).Done():
		t.Fatal("Put outlived its context")
	}
	if _, err := s.Open(bounded(t), "job", 1, "0", true); err == nil {
		t.Fatal("a part whose body never came is readable")
	}
	s.mem.mu.Lock()
	used := s.mem.used
	s.mem.mu.Unlock()
	if used != 0 {
		t.Fatalf("memory held after the cut: %d", used)
	}
}

// With --shm-dir, a part's bytes are a file in shared memory: a reader on
// this host is given its path (MapLocal) and reads the very bytes stored.
// Once handed out, a mapping is never reused for another part: dropping the
// part removes its file, and the next part of the same size gets a new one.
// A mapping never handed out is reused as a spare.
func TestPartsInSharedMemory(t *testing.T) {
	dir := t.TempDir()
	stale := filepath.Join(dir, shmPrefix("a", "t")+"left")
	other := filepath.Join(dir, "stallfree-a-t-batch")
	for _, p := range []string{stale, other} {
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if n := shmdir.RemoveStale(dir, shmPrefix("a", "t")); n != 1 {
		t.Fatalf("stale files removed: %d, want 1", n)
	}
	if _, err := os.Stat(other); err != nil {
		t.Fatalf("a staged batch's file was removed with the parts': %v", err)
	}
	cat := &stepCatalog{}
	s := newTestService(t, cat)
	s.mem.inShm(dir, shmPrefix("a", "t"), func(err error) { t.Errorf("shm refused: %v", err) })
	body := bytes.Repeat([]byte("part-one"), 1024)
	if err := putReplica(t, s, 1, "0", bytes.NewReader(body), body); err != nil {
		t.Fatal(err)
	}
	m, ok := s.MapLocal("job", 1, "0")
	if !ok || m.Size != int64(len(body)) || m.Sum != sum(body) {
		t.Fatalf("MapLocal: %+v %v", m, ok)
	}
	// Committed with these bytes it maps; committed with others it does not
	// (Open drops such a copy and reads another).
	cat.commit("job", 1, catalog.CheckpointPart{Name: "0", Size: int64(len(body)), Sum: sum(body)})
	if _, ok := s.MapLocal("job", 1, "0"); !ok {
		t.Fatal("a committed part held with its committed bytes was not mapped")
	}
	cat.commit("job", 1, catalog.CheckpointPart{Name: "0", Size: int64(len(body)), Sum: sum([]byte("other"))})
	if _, ok := s.MapLocal("job", 1, "0"); ok {
		t.Fatal("a copy unlike the committed bytes was mapped")
	}
	cat.commit("job", 9)
	if got, err := os.ReadFile(m.Path); err != nil || !bytes.Equal(got, body) {
		t.Fatalf("the mapped file holds %d bytes (%v), want the part's %d", len(got), err, len(body))
	}
	if fi, err := os.Stat(m.Path); err != nil || fi.Mode().Perm() != 0o400 {
		t.Fatalf("the part's file: %v %v; want mode 0400", fi, err)
	}
	if _, ok := s.MapLocal("job", 1, "1"); ok {
		t.Fatal("a part not held was mapped")
	}
	if _, ok := s.MapLocal("../job", 1, "0"); ok {
		t.Fatal("a bad name was mapped")
	}
	s.mem.drop(func(partKey) bool { return true })
	if _, err := os.Stat(m.Path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a handed-out part's file after the part was dropped: %v; want it removed", err)
	}
	second := bytes.Repeat([]byte("part-two"), 1024)
	if err := putReplica(t, s, 2, "0", bytes.NewReader(second), second); err != nil {
		t.Fatal(err)
	}
	m2, _ := s.MapLocal("job", 2, "0")
	if m2.Path == m.Path {
		t.Fatal("a handed-out mapping was reused")
	}
	// Not handed out: dropped, then reused for the next part of its size.
	third := bytes.Repeat([]byte("part-3rd"), 1024)
	if err := putReplica(t, s, 3, "0", bytes.NewReader(third), third); err != nil {
		t.Fatal(err)
	}
	files := func() []string { l, _ := filepath.Glob(filepath.Join(dir, shmPrefix("a", "t")+"*")); return l }
	if n := len(files()); n != 2 {
		t.Fatalf("files for two parts: %d", n)
	}
	s.mem.drop(func(k partKey) bool { return k.step == 3 })
	if n := len(files()); n != 2 {
		t.Fatalf("a spare's file was removed: %d files", n)
	}
	if err := putReplica(t, s, 4, "0", bytes.NewReader(third), third); err != nil {
		t.Fatal(err)
	}
	if n := len(files()); n != 2 {
		t.Fatalf("the spare was not reused: %d files", n)
	}
	s.mem.dropAll()
	if n := len(files()); n != 0 {
		t.Fatalf("files left after every part was dropped: %v", files())
	}
	// ... and unmapped: no mapping of them is left in this process.
	if maps, err := os.ReadFile("/proc/self/maps"); err == nil && bytes.Contains(maps, []byte(shmPrefix("a", "t"))) {
		t.Fatalf("a dropped part's file is still mapped:\n%s", maps)
	}
}

// A shared-memory directory that cannot hold a part (here: none at all)
// leaves the part in anonymous memory, stored and readable, and says so.
func TestPartsOutsideSharedMemoryWhenItFails(t *testing.T) {
	s := newTestService(t, &stepCatalog{})
	var told []error
	s.mem.inShm(filepath.Join(t.TempDir(), "missing"), "p-", func(err error) { told = append(told, err) })
	body := []byte("bytes")
	if err := putReplica(t, s, 1, "0", bytes.NewReader(body), body); err != nil {
		t.Fatal(err)
	}
	if len(told) != 1 {
		t.Fatalf("failures told: %v", told)
	}
	if _, ok := s.MapLocal("job", 1, "0"); ok {
		t.Fatal("a part in anonymous memory was mapped")
	}
	if got := localBytes(t, s, 1, "0"); !bytes.Equal(got, body) {
		t.Fatalf("read %q", got)
	}
}
