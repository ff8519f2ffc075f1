package integration

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/client"
	"stallfree/internal/testutil"
)

// The prep cache's contract (docs/api.md, "Prep cache") on three real nodes.

// statusOf is the HTTP status of a client error (0 when err is nil or not
// an API answer).
func statusOf(err error) int {
	if e, ok := errors.AsType[*api.Error](err); ok {
		return e.Status
	}
	return 0
}

// derivedBytes is what the test's "prep stage" makes of item i: sizes differ
// from the parent's, as a decoded image's would.
func derivedBytes(i int) []byte {
	return bytes.Repeat([]byte(fmt.Sprintf("decoded-%04d;", i)), 20+i%7)
}

// getRaw reads path from n and returns the status and body.
func getRaw(t *testing.T, n *proc, path string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(n.c.Base + path)
	if err != nil {
		t.Fatalf("%s GET %s: %v", n.name, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func derivedUsage(t *testing.T, n *proc, name string) (items int, bytes uint64) {
	for _, u := range mustStats(t, n).Datasets {
		if u.Name == name {
			return u.Items, u.Bytes
		}
	}
	return 0, 0
}

func TestDerivedDatasetContract(t *testing.T) {
	nodes := startCluster(t, clusterOpts{nodes: 3, extra: []string{"--max-item-bytes", "4KiB"}})
	dir, files := dataset(t, 60, 1024)
	register(t, nodes[0], "raw", dir)
	ctx := context.Background()
	raw, err := nodes[0].c.Dataset(ctx, "raw")
	if err != nil {
		t.Fatal(err)
	}
	n := raw.Items

	// Creation: from a follower, idempotent from any node, 409 for another
	// stage, 404 for a missing parent, 400 for a body naming both kinds.
	d, err := nodes[1].c.Derive(ctx, "dec", "raw", "decoded-v1")
	if err != nil {
		t.Fatalf("derive: %v", err)
	}
	if d.DerivedFrom != "raw" || d.Stage != "decoded-v1" || d.Items != n || d.Written == nil || *d.Written != 0 {
		t.Fatalf("derived info %+v", d)
	}
	for _, nd := range nodes {
		if _, err := nd.c.Derive(ctx, "dec", "raw", "decoded-v1"); err != nil {
			t.Fatalf("%s: derive again: %v", nd.name, err)
		}
	}
	if _, err := nodes[2].c.Derive(ctx, "dec", "raw", "decoded-v2"); statusOf(err) != 409 {
		t.Fatalf("other stage: %v, want 409", err)
	}
	if _, err := nodes[2].c.Derive(ctx, "other", "missing", "s"); statusOf(err) != 404 {
		t.Fatalf("missing parent: %v, want 404", err)
	}
	if err := nodes[0].c.JSON(ctx, "PUT", "/v1/datasets/x", map[string]string{"source": dir, "derived_from": "raw", "stage": "s"}, nil); statusOf(err) != 400 {
		t.Fatalf("source and derived_from: %v, want 400", err)
	}
	if _, err := nodes[0].c.PutItem(ctx, "raw", 0, []byte("x")); statusOf(err) != 400 {
		t.Fatalf("write to a parent: %v, want 400", err)
	}

	// Derived items live where the parent's do.
	for _, nd := range nodes {
		rawOwners, err := nd.c.Owners(ctx, "raw")
		if err != nil {
			t.Fatal(err)
		}
		decOwners, err := nd.c.Owners(ctx, "dec")
		if err != nil || !bytes.Equal(rawOwners.Owners, decOwners.Owners) || len(decOwners.Owners) != n {
			t.Fatalf("%s: owners of dec differ from raw's: %v", nd.name, err)
		}
	}

	// Nothing written yet: 404 {"error":"not written"} by index and by the
	// parent's key, on every node.
	keys := make([]string, 0, n)
	for k := range files {
		keys = append(keys, k)
	}
	for _, nd := range nodes {
		for _, path := range []string{"/v1/datasets/dec/index/5", "/v1/datasets/dec/items/" + keys[0]} {
			code, body := getRaw(t, nd, path)
			if code != 404 || strings.TrimSpace(string(body)) != `{"error":"not written"}` {
				t.Fatalf("%s GET %s: %d %s", nd.name, path, code, body)
			}
		}
	}

	routed := client.New(nodes[0].c.Base, "").RouteByOwner()
	for i := range 6 {
		if _, err := routed.ItemByIndex(ctx, "dec", i); statusOf(err) != 404 || !strings.Contains(err.Error(), "not written") {
			t.Fatalf("owner-routed read of unwritten item %d: %v", i, err)
		}
	}

	// Writes from every node: the first is 201, the same bytes again (from
	// another node) 200, other bytes 409 and the first stay.
	for i := range n {
		w := nodes[i%3]
		created, err := w.c.PutItem(ctx, "dec", i, derivedBytes(i))
		if err != nil || !created {
			t.Fatalf("write %d from %s: created %v, %v", i, w.name, created, err)
		}
		again := nodes[(i+1)%3]
		if created, err := again.c.PutItem(ctx, "dec", i, derivedBytes(i)); err != nil || created {
			t.Fatalf("same bytes again %d from %s: created %v, %v (want 200)", i, again.name, created, err)
		}
	}
	if _, err := nodes[2].c.PutItem(ctx, "dec", 7, []byte("other bytes")); statusOf(err) != 409 {
		t.Fatalf("other bytes: %v, want 409", err)
	}
	if _, err := nodes[1].c.PutItem(ctx, "dec", n, []byte("x")); statusOf(err) != 404 {
		t.Fatalf("index %d of %d: %v, want 404", n, n, err)
	}
	if _, err := nodes[1].c.PutItem(ctx, "dec", -1, []byte("x")); statusOf(err) != 404 && statusOf(err) != 400 {
		t.Fatalf("index -1: %v, want 404 or 400", err)
	}
	if _, err := nodes[1].c.PutItem(ctx, "dec", 3, make([]byte, 4097)); statusOf(err) != 413 {
		t.Fatalf("over --max-item-bytes: %v, want 413", err)
	}

	// Every node reads every item byte for byte, by index and by key.
	for _, nd := range nodes {
		for i := range n {
			it, err := nd.c.ItemByIndex(ctx, "dec", i)
			if err != nil || !bytes.Equal(it.Data, derivedBytes(i)) {
				t.Fatalf("%s index %d: %v, %d bytes", nd.name, i, err, len(it.Data))
			}
			byKey, err := nd.c.ItemByKey(ctx, "dec", it.Key)
			if err != nil || !bytes.Equal(byKey.Data, derivedBytes(i)) {
				t.Fatalf("%s key %s: %v", nd.name, it.Key, err)
			}
		}
	}

	// Each item is held once, at its owner, and never read from storage;
	// written is counted cluster-wide and the same on every node.
	var held int
	var want uint64
	for i := range n {
		want += uint64(len(derivedBytes(i)))
	}
	for _, nd := range nodes {
		items, _ := derivedUsage(t, nd, "dec")
		held += items
	}
	if held != n {
		t.Fatalf("the nodes hold %d derived items, want %d (each once)", held, n)
	}
	for _, nd := range nodes {
		info, err := nd.c.Dataset(ctx, "dec")
		if err != nil || info.Written == nil || *info.Written != n || info.Bytes != int64(want) {
			t.Fatalf("%s info: %+v, %v (want written %d, bytes %d)", nd.name, info, err, n, want)
		}
		if st := mustStats(t, nd); st.SourceReads != 0 && nd != nodes[0] {
			// Only the parent's registration reads storage, and it reads no item.
			t.Fatalf("%s read storage %d times", nd.name, st.SourceReads)
		}
	}

	// A batch of writes (PUT …/batch) from one node lands each item at its
	// owner, as single writes do: the nodes together hold each once, and
	// every node reads it back byte for byte. Items already there answer
	// 200, other bytes 409 (the first stay), beside new ones written. A
	// batch with one bad item writes nothing.
	if _, err := nodes[1].c.Derive(ctx, "dec2", "raw", "batched-v1"); err != nil {
		t.Fatal(err)
	}
	half := make([]api.ItemWrite, 0, n/2)
	for i := 0; i < n; i += 2 {
		half = append(half, api.ItemWrite{Index: i, Data: derivedBytes(i)})
	}
	results, err := nodes[2].c.PutItems(ctx, "dec2", half)
	for x, res := range results {
		if res.Index != half[x].Index || res.Status != 201 || !res.Created || res.Bytes != len(half[x].Data) {
			t.Fatalf("batch write %d: %+v", x, res)
		}
	}
	if err != nil || len(results) != len(half) {
		t.Fatalf("batch write: %d results, %v", len(results), err)
	}
	for _, bad := range [][]api.ItemWrite{
		{{Index: 1, Data: derivedBytes(1)}, {Index: n, Data: []byte("x")}},        // out of range
		{{Index: 1, Data: derivedBytes(1)}, {Index: 3, Data: make([]byte, 4097)}}, // over --max-item-bytes
		{}, // empty
	} {
		if _, err := nodes[0].c.PutItems(ctx, "dec2", bad); statusOf(err) != 400 && statusOf(err) != 404 && statusOf(err) != 413 {
			t.Fatalf("a bad batch: %v, want 400, 404 or 413", err)
		}
	}
	if _, err := nodes[0].c.PutItems(ctx, "raw", half[:1]); statusOf(err) != 400 {
		t.Fatalf("a batch to a parent: %v, want 400", err)
	}
	all := make([]api.ItemWrite, n)
	for i := range n {
		all[i] = api.ItemWrite{Index: i, Data: derivedBytes(i)}
	}
	all[4].Data = []byte("other bytes") // 4 was written above
	results, err = nodes[0].c.PutItems(ctx, "dec2", all)
	if err != nil {
		t.Fatal(err)
	}
	for i, res := range results {
		want := map[bool]int{true: 200, false: 201}[i%2 == 0]
		if i == 4 {
			want = 409
		}
		if res.Index != i || res.Status != want || res.Created != (want == 201) || (want == 409) != (res.Error != "") {
			t.Fatalf("batch write of item %d: %+v, want status %d", i, res, want)
		}
	}
	held = 0
	for _, nd := range nodes {
		items, _ := derivedUsage(t, nd, "dec2")
		held += items
		for i := range n {
			it, err := nd.c.ItemByIndex(ctx, "dec2", i)
			if err != nil || !bytes.Equal(it.Data, derivedBytes(i)) {
				t.Fatalf("%s reads dec2 item %d: %v, %q", nd.name, i, err, it.Data)
			}
		}
	}
	if held != n {
		t.Fatalf("the nodes hold %d items of dec2, want %d (each once)", held, n)
	}

	// cachectl shows the derived dataset with its parent and stage, and the
	// cluster's memory per dataset, parent and derived apart.
	ctl := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(filepath.Join(binDir, "cachectl"), append([]string{"--node", "http://" + nodes[1].http}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("cachectl %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	if out := ctl("datasets", "ls"); !strings.Contains(out, fmt.Sprintf("derived from raw, stage decoded-v1, %d written", n)) {
		t.Fatalf("datasets ls:\n%s", out)
	}
	if out := ctl("stats"); !regexp.MustCompile(fmt.Sprintf(`(?m)^dec\s+derived from raw\s+%d\s`, n)).MatchString(out) {
		t.Fatalf("stats:\n%s", out)
	}

	// Deleting the parent deletes the derived dataset and frees its items.
	if err := nodes[2].c.DeleteDataset(ctx, "raw"); err != nil {
		t.Fatal(err)
	}
	for _, nd := range nodes {
		testutil.AwaitWithin(t, 10*time.Second, nd.name+" forgets dec", func() bool {
			_, err := nd.c.Dataset(ctx, "dec")
			items, _ := derivedUsage(t, nd, "dec")
			return statusOf(err) == 404 && items == 0 && mustStats(t, nd).ItemsCached == 0
		})
	}
}

// Derived items are evicted before items read from storage, never evict
// one, and read as not written once evicted.
func TestDerivedEvictedFirst(t *testing.T) {
	p := startNode(t, nodeOpts{name: "e1", bootstrap: true, memory: "1MiB"})
	dir, _ := datasetFixed(t, 100, 8192)
	register(t, p, "raw", dir)
	ctx := context.Background()
	if _, err := p.c.Derive(ctx, "dec", "raw", "s1"); err != nil {
		t.Fatal(err)
	}
	item := bytes.Repeat([]byte{7}, 8192)
	for i := range 50 {
		if _, err := p.c.PutItem(ctx, "dec", i, item); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	for i := range 100 {
		if _, err := p.c.ItemByIndex(ctx, "raw", i); err != nil {
			t.Fatalf("parent item %d: %v", i, err)
		}
	}
	// 1 MiB holds all 100 parent items (8192 + 128 bytes each) and 26 of
	// the derived ones: the parent's fills evicted 24.
	rawItems, _ := derivedUsage(t, p, "raw")
	decItems, _ := derivedUsage(t, p, "dec")
	if rawItems != 100 || decItems != 26 {
		t.Fatalf("resident: %d parent, %d derived items; want 100 and 26", rawItems, decItems)
	}
	readable := 0
	for i := range 50 {
		_, err := p.c.ItemByIndex(ctx, "dec", i)
		switch {
		case err == nil:
			readable++
		case statusOf(err) != 404 || !strings.Contains(err.Error(), "not written"):
			t.Fatalf("evicted derived item %d: %v, want 404 not written", i, err)
		}
	}
	if readable != 26 {
		t.Fatalf("%d derived items readable, want 26", readable)
	}
	// Full of items it may not evict: a derived write is not kept (507),
	// and nothing else moves.
	if _, err := p.c.PutItem(ctx, "dec", 99, item); statusOf(err) != 507 {
		t.Fatalf("write into a full store: %v, want 507", err)
	}
	if r, d := must2(derivedUsage(t, p, "raw")), must2(derivedUsage(t, p, "dec")); r != 100 || d != 26 {
		t.Fatalf("after a refused write: %d parent, %d derived", r, d)
	}
	info, err := p.c.Dataset(ctx, "dec")
	if err != nil || info.Written == nil || *info.Written != 26 {
		t.Fatalf("written after evictions: %+v %v, want 26", info, err)
	}
}

func must2(a int, _ uint64) int { return a }

// datasetFixed writes n files of exactly size bytes.
func datasetFixed(t *testing.T, n, size int) (string, []string) {
	t.Helper()
	dir := t.TempDir()
	var keys []string
	for i := range n {
		k := fmt.Sprintf("f%05d.bin", i)
		if err := os.WriteFile(filepath.Join(dir, k), bytes.Repeat([]byte{byte(i)}, size), 0o644); err != nil {
			t.Fatal(err)
		}
		keys = append(keys, k)
	}
	return dir, keys
}

// Derived items move with their owner when a member joins (never read from
// storage, which has none), and a member's loss loses its share only: those
// items read as not written and are written again.
func TestDerivedItemsFollowMembership(t *testing.T) {
	nodes := startCluster(t, clusterOpts{nodes: 2})
	dir, _ := dataset(t, 120, 600)
	register(t, nodes[0], "raw", dir)
	ctx := context.Background()
	if _, err := nodes[1].c.Derive(ctx, "dec", "raw", "s1"); err != nil {
		t.Fatal(err)
	}
	const n = 120
	for i := range n {
		if _, err := nodes[i%2].c.PutItem(ctx, "dec", i, derivedBytes(i)); err != nil {
			t.Fatalf("write %d: %v", i, err)
		}
	}
	n3 := startNode(t, nodeOpts{name: "n3", join: []string{nodes[0].gossip}})
	all := append(slices.Clone(nodes), n3)
	waitMembers(t, all, []string{"n1", "n2", "n3"})
	held := func(ps []*proc) (sum int, each []int) {
		for _, p := range ps {
			items, _ := derivedUsage(t, p, "dec")
			sum += items
			each = append(each, items)
		}
		return sum, each
	}
	// The old owners hand n3 its share (rehoming, then handoffs on reads).
	testutil.AwaitWithin(t, 20*time.Second, "n3 to hold its share of dec", func() bool {
		sum, each := held(all)
		return sum == n && each[2] > 0
	})
	for _, p := range all {
		for i := range n {
			it, err := p.c.ItemByIndex(ctx, "dec", i)
			if err != nil || !bytes.Equal(it.Data, derivedBytes(i)) {
				t.Fatalf("%s item %d after the join: %v", p.name, i, err)
			}
		}
	}
	sum, each := held(all)
	if sum != n {
		t.Fatalf("after the join the members hold %v derived items, want %d in all (each once)", each, n)
	}
	lost := each[2]
	n3.kill()
	waitMembers(t, nodes, []string{"n1", "n2"})
	var gone []int
	for i := range n {
		_, err := nodes[0].c.ItemByIndex(ctx, "dec", i)
		switch {
		case err == nil:
		case statusOf(err) == 404:
			gone = append(gone, i)
		default:
			t.Fatalf("item %d after n3's loss: %v", i, err)
		}
	}
	if len(gone) != lost {
		t.Fatalf("%d items read as not written after n3 was lost; it held %d", len(gone), lost)
	}
	if info, err := nodes[1].c.Dataset(ctx, "dec"); err != nil || info.Written == nil || *info.Written != n-lost {
		t.Fatalf("written after the loss: %+v %v, want %d", info, err, n-lost)
	}
	for _, i := range gone {
		if created, err := nodes[1].c.PutItem(ctx, "dec", i, derivedBytes(i)); err != nil || !created {
			t.Fatalf("writing %d again: %v %v", i, created, err)
		}
	}
	if info, err := nodes[0].c.Dataset(ctx, "dec"); err != nil || *info.Written != n {
		t.Fatalf("written after writing the lost share again: %+v %v", info, err)
	}
	for _, p := range nodes {
		if st := mustStats(t, p); st.SourceReads != 0 {
			t.Fatalf("%s read storage %d times for a derived dataset", p.name, st.SourceReads)
		}
	}
}
