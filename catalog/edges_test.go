package catalog

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"slices"
	"testing"
	"time"

	"github.com/hashicorp/raft"
	"github.com/vmihailenco/msgpack/v5"

	"stallfree/internal/testutil"
	"stallfree/source"
)

// An empty manifest is a manifest: well formed, no items, nothing found.
func TestEmptyManifest(t *testing.T) {
	m := NewManifest(nil)
	if !m.wellFormed() || m.Len() != 0 || m.Bytes() != 0 {
		t.Fatalf("empty manifest: well formed %v, %d items, %d bytes", m.wellFormed(), m.Len(), m.Bytes())
	}
	if _, ok := m.Index("a"); ok {
		t.Fatal("a key found in an empty manifest")
	}
}

// Tags survive when the first entries have none, in 4 bytes an item when
// they fit 32 bits (Stamps) and 8 otherwise, and the manifest's size counts
// every part it holds.
func TestTagsAndBytes(t *testing.T) {
	for _, c := range []struct {
		base    uint64
		perItem int
	}{{1000, 4}, {1 << 40, 8}} {
		es := frontCodingKeys(20)
		for i := 3; i < len(es); i++ {
			es[i].Tag = c.base + uint64(i)
		}
		m := NewManifest(es)
		for i, want := range es {
			if got := m.Entry(i); got != want {
				t.Fatalf("entry %d: %+v, want %+v", i, got, want)
			}
		}
		if want := len(m.Blocks) + len(m.Starts) + 4*len(es) + c.perItem*len(es); m.Bytes() != int64(want) {
			t.Fatalf("a manifest tagged from %d: %d bytes, want %d", c.base, m.Bytes(), want)
		}
	}
	tar := NewManifest(tarEntries())
	tar.seal()
	n := len(tarEntries())
	if want := len(tar.Blocks) + len(tar.Starts) + 4*n + 4*n + 8*n + 4*(len(tar.tar.byKey)+len(tar.tar.samples)); tar.Bytes() != int64(want) {
		t.Fatalf("a tar manifest: %d bytes, want %d", tar.Bytes(), want)
	}
}

// Lookups of keys that are not there, past the last key of every block and
// of the whole manifest, and in a tar manifest past its last key, find
// nothing; every key that is there is found.
func TestIndexMisses(t *testing.T) {
	es := frontCodingKeys(3*manifestBlock + 5)
	m := NewManifest(es)
	for b := 0; b*manifestBlock < len(es); b++ {
		last := es[min((b+1)*manifestBlock, len(es))-1].Key
		if x, ok := m.Index(last + "\x00"); ok {
			t.Fatalf("a key after block %d's last found at %d", b, x)
		}
	}
	if _, ok := m.Index("zzz"); ok {
		t.Fatal("a key after every key found")
	}
	tar := NewManifest(tarEntries())
	tar.seal()
	if _, ok := tar.Index("zzz"); ok {
		t.Fatal("a key after every tar member found")
	}
}

// A tar member whose name is a prefix of the member before it (archive
// order is not sorted) is coded and found.
func TestTarMemberPrefixOfTheOneBefore(t *testing.T) {
	es := tarEntries()[:3]
	es[1].Key = es[0].Key[:len(es[0].Key)-1]
	m := NewManifest(es)
	m.seal()
	if !m.wellFormed() {
		t.Fatal("not well formed")
	}
	for i, e := range es {
		if m.Key(i) != e.Key {
			t.Fatalf("key %d: %q, want %q", i, m.Key(i), e.Key)
		}
	}
}

// A chunk joined to a manifest that does not end on a block boundary (an
// earlier version's chunking) is coded key by key, and comes out whole.
func TestUnalignedChunkJoins(t *testing.T) {
	es := frontCodingKeys(2*manifestBlock + 9)
	for _, cut := range []int{5, manifestBlock + 3} {
		m := NewManifest(es[:cut])
		m.appendChunk(NewManifest(es[cut:]))
		if !m.wellFormed() || m.Len() != len(es) {
			t.Fatalf("cut at %d: well formed %v, %d items", cut, m.wellFormed(), m.Len())
		}
		for i, e := range es {
			if m.Key(i) != e.Key || m.Size(i) != e.Size {
				t.Fatalf("cut at %d, item %d: %q of %d bytes, want %q of %d", cut, i, m.Key(i), m.Size(i), e.Key, e.Size)
			}
		}
		// Coded against the key before, as if it had never been cut.
		if whole := NewManifest(es); !bytes.Equal(m.Blocks, whole.Blocks) {
			t.Fatalf("cut at %d: %d bytes of blocks, %d uncut", cut, len(m.Blocks), len(whole.Blocks))
		}
	}
}

// wellFormed at each of its bounds: exactly at the limit passes, one past
// it does not.
func TestWellFormedBounds(t *testing.T) {
	m := NewManifest(frontCodingKeys(3))
	binary.LittleEndian.PutUint32(m.Sizes, source.MaxItemSize)
	if !m.wellFormed() {
		t.Fatal("an item of exactly MaxItemSize bytes is refused")
	}
	m = NewManifest(frontCodingKeys(3))
	m.Tags = make([]uint64, 3)
	if !m.wellFormed() {
		t.Fatal("a tag per item is refused")
	}
	m.Tags = m.Tags[:2]
	if m.wellFormed() {
		t.Fatal("fewer tags than items is well formed")
	}
	c := NewManifest(tarEntries()[:12]) // two shards
	c.ShardOf[0] = uint32(len(c.Shards) - 1)
	if !c.wellFormed() {
		t.Fatal("an item of the chunk's last shard is refused")
	}
	c.ShardOf[0] = uint32(len(c.Shards))
	if c.wellFormed() {
		t.Fatal("an item of the shard just past the chunk's list is well formed")
	}

	// Two keys in one block, "a" then "b" coded as (0, 1, "a"), (0, 1, "b").
	raw := func(blocks ...byte) *Manifest {
		return &Manifest{Blocks: blocks, Starts: make([]byte, 8), Sizes: make([]byte, 8), Count: 2}
	}
	if !raw(0, 1, 'a', 0, 1, 'b').wellFormed() {
		t.Fatal("the hand-coded block is refused")
	}
	// The first key's rest claims one byte more than its block holds.
	if raw(0, 5, 'a', 0, 1, 'b').wellFormed() {
		t.Fatal("a key running one byte past its block is well formed")
	}
	// The last key ends after its shared-prefix count: no rest length.
	if raw(0, 1, 'a', 1).wellFormed() {
		t.Fatal("a key cut after its shared count is well formed")
	}
}

// A pinned epoch keeps the newest keptEpochPins pins of a job, no fewer.
func TestPinsKeptPerJob(t *testing.T) {
	f := &fsm{st: newState()}
	f.st.Jobs["j"] = &Job{Name: "j"}
	for e := range uint64(keptEpochPins + 1) {
		f.apply(e+1, &command{Op: opPinEpoch, Name: "j", Epoch: e, Members: []string{fmt.Sprint("m", e)}})
	}
	pins := f.st.Pins["j"]
	if len(pins) != keptEpochPins {
		t.Fatalf("%d pins kept, want %d", len(pins), keptEpochPins)
	}
	if _, ok := pins[0]; ok {
		t.Fatal("the oldest pin was kept")
	}
	if m := pins[keptEpochPins]; !slices.Equal(m, []string{fmt.Sprint("m", keptEpochPins)}) {
		t.Fatalf("the newest pin: %v", m)
	}
}

// A snapshot without some of the state's maps (an older version's) restores
// to a catalog that takes every command, and tells the node it changed.
func TestRestoreFillsMissingMaps(t *testing.T) {
	b, err := msgpack.Marshal(&state{NextID: 4})
	if err != nil {
		t.Fatal(err)
	}
	changes := 0
	f := &fsm{st: newState(), onChange: func() { changes++ }}
	if err := f.Restore(io.NopCloser(bytes.NewReader(b))); err != nil {
		t.Fatal(err)
	}
	if changes != 1 {
		t.Fatalf("a restore told the node %d times, want once", changes)
	}
	f.apply(1, &command{Op: opBegin, Name: "d", Source: "/data", Token: "t", Count: 1})
	f.st.Jobs["j"] = &Job{Name: "j"}
	f.apply(2, &command{Op: opPinEpoch, Name: "j", Epoch: 0, Members: []string{"m"}})
	if p := f.st.Pending["d"]; p == nil || p.ID != 4 || len(f.st.Pins["j"]) != 1 {
		t.Fatalf("after restoring: pending %+v, pins %v", p, f.st.Pins)
	}
	f.st.Datasets["d"] = &Dataset{Name: "d", Manifest: NewManifest(nil)}
	if g, ok := f.apply(3, &command{Op: opPutGroup, Name: "g", Group: &Group{Name: "g", Dataset: "d", BatchSize: 1, Jobs: 1, Window: 1}}).(*Group); !ok || f.st.Groups["g"] != g {
		t.Fatalf("a group defined after the restore: %v, groups %v", g, f.st.Groups)
	}
}

// A chunk fills up to maxBytes of keys (8 bytes of size each) in whole
// blocks: bytes exactly at the bound still go in, one byte more waits for the
// next chunk, and no entries still give one (empty) chunk.
func TestChunksFillToTheBound(t *testing.T) {
	es := make([]source.Entry, 100)
	for i := range es {
		es[i] = source.Entry{Key: fmt.Sprintf("k%07d", i), Size: 1} // 8 + 8 bytes
	}
	sizes := func(es []source.Entry, maxBytes int) []int {
		var out []int
		for _, c := range chunks(es, maxBytes) {
			out = append(out, len(c))
		}
		return out
	}
	exact := 3 * manifestBlock * 16
	for _, tc := range []struct {
		maxBytes int
		want     []int
	}{
		{exact, []int{48, 48, 4}},
		{exact - 1, []int{32, 32, 36}},        // 47 fit, so two blocks; then the rest
		{1, []int{16, 16, 16, 16, 16, 16, 4}}, // never less than a block
		{1 << 20, []int{100}},
	} {
		if got := sizes(es, tc.maxBytes); !slices.Equal(got, tc.want) {
			t.Errorf("chunks of %d bytes: %v entries, want %v", tc.maxBytes, got, tc.want)
		}
	}
	// A rest of one block and one key is two chunks, not one over the bound.
	if got := sizes(es[:97], 1); !slices.Equal(got, []int{16, 16, 16, 16, 16, 16, 1}) {
		t.Errorf("97 entries in chunks of 1 byte: %v", got)
	}
	if got := chunks(nil, exact); len(got) != 1 || len(got[0]) != 0 {
		t.Fatalf("no entries: %d chunks, want one empty", len(got))
	}
}

// A sample's key is cut at the first "." of the member's base name, never of
// its directory, and a base name that starts with "." is a sample of its own
// with an empty stem (WebDataset's rule).
func TestSampleKeysOfDottedPaths(t *testing.T) {
	var es []source.Entry
	for j, member := range []string{"v1.0/x.jpg", "v1.0/x.cls", "v1.0/.jpg", "y.z/w.jpg", "a./b.jpg"} {
		es = append(es, source.Entry{Key: "s.tar/" + member, Size: 1, Shard: "s.tar", ShardSize: 1 << 20, Offset: int64(512 + 1024*j)})
	}
	m := NewManifest(es)
	m.seal()
	var keys []string
	for s := range m.Samples() {
		keys = append(keys, m.SampleKey(s))
	}
	if want := []string{"s.tar/v1.0/x", "s.tar/v1.0/", "s.tar/y.z/w", "s.tar/a./b"}; !slices.Equal(keys, want) {
		t.Fatalf("sample keys %q, want %q", keys, want)
	}
	if m.Ext(2) != "jpg" {
		t.Fatalf("extension of v1.0/.jpg: %q, want jpg", m.Ext(2))
	}
}

// A second catalog joins through the leader's AddServer: as a non-voter,
// then a voter; it catches up with what the leader wrote, refuses writes
// itself, and is gone from the configuration once removed. A catalog never
// bootstrapped and never added knows no leader.
func TestServersJoinCatchUpAndLeave(t *testing.T) {
	lead := openLeader(t, t.TempDir(), testutil.FreeAddr(t))
	defer lead.Close()
	if _, _, err := lead.RegisterDataset("ds", "dir:///data", entries(10), 0); err != nil {
		t.Fatal(err)
	}
	addr := testutil.FreeAddr(t)
	f, err := Open(Config{Key: testutil.ClusterKey(), NodeID: "n2", Bind: addr, Dir: t.TempDir(), Timing: LocalTiming()})
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if ok, why := f.CaughtUp(); ok || why != "no raft leader known yet" {
		t.Fatalf("CaughtUp before joining: %v %q", ok, why)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	err = f.WaitLeader(ctx)
	cancel()
	if !errors.Is(err, ErrNoLeader) || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("WaitLeader alone: %v", err)
	}
	if _, _, err := f.RegisterDataset("x", "dir:///x", entries(1), 0); !errors.Is(err, ErrNoLeader) {
		t.Fatalf("a write with no leader: %v", err)
	}
	roles := func() map[string]bool {
		t.Helper()
		servers, err := lead.Servers()
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]bool{}
		for _, s := range servers {
			out[s.ID] = s.Voter
		}
		return out
	}
	if err := lead.AddServer("n2", addr, false); err != nil {
		t.Fatal(err)
	}
	if r := roles(); len(r) != 2 || !r["n1"] || r["n2"] {
		t.Fatalf("after adding a non-voter: %v", r)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := f.WaitLeader(ctx); err != nil || f.Leader() != "n1" {
		t.Fatalf("the follower's leader: %q %v", f.Leader(), err)
	}
	f.WaitFor(ctx, func() bool { ok, _ := f.CaughtUp(); return ok && f.AppliedIndex() >= lead.AppliedIndex() })
	if ok, why := f.CaughtUp(); !ok {
		t.Fatalf("never caught up: %s", why)
	}
	if d, ok := f.Dataset("ds"); !ok || d.Manifest.Len() != 10 {
		t.Fatal("the follower lacks the leader's dataset")
	}
	if _, _, err := f.RegisterDataset("x", "dir:///x", entries(1), 0); !errors.Is(err, ErrNotLeader) {
		t.Fatalf("a write on a follower: %v", err)
	}
	if err := lead.AddServer("n2", addr, true); err != nil {
		t.Fatal(err)
	}
	if r := roles(); len(r) != 2 || !r["n2"] {
		t.Fatalf("after promoting n2: %v", r)
	}
	if err := lead.RemoveServer("n2"); err != nil {
		t.Fatal(err)
	}
	if r := roles(); len(r) != 1 || !r["n1"] {
		t.Fatalf("after removing n2: %v", r)
	}
}

// The FSM counts what it has applied itself: a follower waiting for a
// relayed write waits for the write, not for raft handing it over. A
// restore leaves the count to raft until the next command.
func TestFSMCountsWhatItApplied(t *testing.T) {
	cmd, err := msgpack.Marshal(&command{Op: opDeleteDataset, Name: "nothing"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fsm{st: newState()}
	if f.applied.Load() != 0 {
		t.Fatal("applied before any command")
	}
	f.Apply(&raft.Log{Index: 7, Data: cmd})
	if got := f.applied.Load(); got != 7 {
		t.Fatalf("applied %d after the command at 7", got)
	}
	snap, err := msgpack.Marshal(newState())
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Restore(io.NopCloser(bytes.NewReader(snap))); err != nil {
		t.Fatal(err)
	}
	if got := f.applied.Load(); got != 0 {
		t.Fatalf("applied %d after a restore, want raft's count (0 here)", got)
	}
}

// The zero Timing is LANTiming, the one cachenode's --timing lan picks; a
// profile given is raft's, as given; trailing logs and the snapshot
// threshold are the catalog's own, whichever profile.
func TestTimingProfiles(t *testing.T) {
	for _, tc := range []struct {
		name  string
		given Timing
		want  Timing
	}{{"zero", Timing{}, LANTiming()}, {"local", LocalTiming(), LocalTiming()}, {"lan", LANTiming(), LANTiming()}} {
		c, err := Open(Config{Key: testutil.ClusterKey(), NodeID: "n1", Bind: testutil.FreeAddr(t), Dir: t.TempDir(), Bootstrap: true, Timing: tc.given})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := c.raft.ReloadableConfig()
		c.Close()
		if got.HeartbeatTimeout != tc.want.HeartbeatTimeout || got.ElectionTimeout != tc.want.ElectionTimeout {
			t.Fatalf("%s: raft runs with heartbeat %v, election %v; want %v, %v", tc.name, got.HeartbeatTimeout, got.ElectionTimeout,
				tc.want.HeartbeatTimeout, tc.want.ElectionTimeout)
		}
		if got.TrailingLogs != 256 || got.SnapshotThreshold != 1024 {
			t.Fatalf("%s: trailing logs %d, snapshot threshold %d", tc.name, got.TrailingLogs, got.SnapshotThreshold)
		}
	}
	if LocalTiming() == LANTiming() {
		t.Fatal("the local profile is the LAN one")
	}
}

// Datasets are numbered from 1 in the order they are recorded, derived ones
// too, so an ID of 0 never names one (the wire and the API show IDs as
// they are), and a deleted dataset's number is not given again.
func TestDatasetIDsCountUpFromOne(t *testing.T) {
	c := openLeader(t, t.TempDir(), testutil.FreeAddr(t))
	defer c.Close()
	a, _, err := c.RegisterDataset("a", "dir:///a", entries(3), 0)
	if err != nil {
		t.Fatal(err)
	}
	d, _, err := c.DeriveDataset("a.dec", "a", "decode")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteDataset("a"); err != nil {
		t.Fatal(err)
	}
	b, _, err := c.RegisterDataset("b", "dir:///b", entries(2), 0)
	if err != nil {
		t.Fatal(err)
	}
	if a.ID != 1 || d.ID != 2 || b.ID != 3 {
		t.Fatalf("IDs %d, %d, %d: want 1, 2, 3", a.ID, d.ID, b.ID)
	}
}

// Before the FSM has applied a command, the applied index is raft's: a new
// leader has applied its configuration and its term's first entry, and a
// node answering 0 would tell a follower waiting for it that nothing is
// there to wait for.
func TestAppliedIndexBeforeAnyCommand(t *testing.T) {
	c := openLeader(t, t.TempDir(), testutil.FreeAddr(t))
	defer c.Close()
	testutil.Await(t, "raft to apply its first entries", func() bool { return c.raft.AppliedIndex() > 0 })
	if got, raft := c.AppliedIndex(), c.raft.AppliedIndex(); got == 0 || got != raft {
		t.Fatalf("applied index %d before any command, raft's %d", got, raft)
	}
	if _, _, err := c.RegisterDataset("a", "dir:///a", entries(3), 0); err != nil {
		t.Fatal(err)
	}
	if got := c.AppliedIndex(); got != c.fsm.applied.Load() || got == 0 {
		t.Fatalf("applied index %d after a command, the FSM's %d", got, c.fsm.applied.Load())
	}
}

// Chunks of a listing append whatever their fingerprints: untagged, 32-bit
// (Stamps) and 64-bit (Tags) chunks in any order give every entry its own.
func TestChunksWithMixedFingerprints(t *testing.T) {
	es := frontCodingKeys(30)
	tags := []uint64{0, 7, 1 << 40} // per chunk of 10: none, small, wide
	for i := range es {
		if t := tags[i/10]; t != 0 {
			es[i].Tag = t + uint64(i)
		}
	}
	for _, order := range [][]int{{0, 1, 2}, {1, 0, 2}, {1, 2, 0}, {0, 1}, {1, 0}} {
		var m *Manifest
		var want []source.Entry
		for _, k := range order {
			c := NewManifest(es[k*10 : (k+1)*10])
			want = append(want, es[k*10:(k+1)*10]...)
			if m == nil {
				m = c
				continue
			}
			m.appendChunk(c)
		}
		if !m.wellFormed() {
			t.Fatalf("chunks %v: not well formed", order)
		}
		for i := range want {
			if got := m.Entry(i); got.Tag != want[i].Tag || got.Key != want[i].Key {
				t.Fatalf("chunks %v, entry %d: %+v, want %+v", order, i, got, want[i])
			}
		}
	}
}
