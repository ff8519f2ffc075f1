package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/client"
	"stallfree/internal/testutil"
)

// cachectl drives a real two-node cluster end to end, with a token.
func TestCachectl(t *testing.T) {
	testutil.Long(t)
	dir, files := dataset(t, 120, 4000)
	keys := slices.Sorted(maps.Keys(files)) // the manifest's order
	tokenFile := filepath.Join(t.TempDir(), "token")
	os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600)
	n1 := startNode(t, nodeOpts{name: "n1", bootstrap: true, token: tokenFile})
	n2 := startNode(t, nodeOpts{name: "n2", join: []string{n1.gossip}, token: tokenFile})
	ctl := func(node *proc, args ...string) (string, error) {
		cmd := exec.Command(filepath.Join(binDir, "cachectl"), append([]string{"--node", "http://" + node.http, "--token-file", tokenFile}, args...)...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	must := func(node *proc, args ...string) string {
		t.Helper()
		out, err := ctl(node, args...)
		if err != nil {
			t.Fatalf("cachectl %s: %v\n%s", strings.Join(args, " "), err, out)
		}
		return out
	}
	testutil.AwaitWithin(t, 30*time.Second, "two members with a leader", func() bool {
		out, err := ctl(n2, "--json", "members")
		var cl struct {
			Leader  string
			Members []struct{ State string }
		}
		return err == nil && json.Unmarshal([]byte(out), &cl) == nil && cl.Leader != "" && len(cl.Members) == 2 &&
			cl.Members[0].State == "alive" && cl.Members[1].State == "alive"
	})
	if out := must(n2, "datasets", "add", "ds", dir); !strings.Contains(out, "120 items") {
		t.Fatalf("datasets add: %s", out)
	}
	// A tar dataset counts samples, its members beside them.
	wds := filepath.Join(t.TempDir(), "wds")
	must(n1, "gendata", wds, "--format", "tar", "--items", "30", "--shard-samples", "10", "--size", "1KiB")
	if out := must(n1, "datasets", "add", "wds", "tar+dir://"+wds); !strings.Contains(out, "dataset wds: 30 samples (90 members),") {
		t.Fatalf("datasets add of a tar dataset: %s", out)
	}
	if out := must(n1, "datasets", "ls"); !strings.Contains(out, "ds") || !strings.Contains(out, "dir://"+dir) {
		t.Fatalf("datasets ls: %s", out)
	}
	var wp struct{ Done, Total int64 }
	if err := json.Unmarshal([]byte(must(n1, "--json", "warmup", "ds")), &wp); err != nil || wp.Done != 120 || wp.Total != 120 {
		t.Fatalf("warmup: %+v %v", wp, err)
	}
	var stats []struct {
		ItemsCached int    `json:"items_cached"`
		SourceReads uint64 `json:"source_reads"`
	}
	if err := json.Unmarshal([]byte(must(n2, "--json", "stats")), &stats); err != nil || len(stats) != 2 ||
		stats[0].ItemsCached+stats[1].ItemsCached != 120 || stats[0].SourceReads+stats[1].SourceReads != 120 {
		t.Fatalf("stats: %+v %v", stats, err)
	}
	if out := must(n2, "epoch", "ds", "--verify", dir); !strings.Contains(out, "wrong bytes in 0 items") || !strings.Contains(out, "miss 0") {
		t.Fatalf("epoch: %s", out)
	}
	// Routed by owner (with the token on every node): every item from the
	// node holding it, none through a peer.
	var routed []struct{ Items, Hit, Peer, Miss, Wrong int }
	if err := json.Unmarshal([]byte(must(n2, "--json", "epoch", "ds", "--route", "owner", "--verify", dir)), &routed); err != nil ||
		len(routed) != 1 || routed[0].Hit != 120 || routed[0].Peer != 0 || routed[0].Wrong != 0 {
		t.Fatalf("epoch --route owner: %+v %v", routed, err)
	}
	must(n1, "jobs", "add", "train", "--dataset", "ds", "--seed", "3", "--world-size", "2", "--batch-size", "8", "--ranks", "n1,n2")
	if out := must(n2, "jobs", "ls"); !strings.Contains(out, "train") {
		t.Fatalf("jobs ls: %s", out)
	}
	seen := map[string]bool{}
	for r, node := range []*proc{n1, n2} {
		lines := strings.Fields(must(node, "sample", "train", "--epoch", "0", "--rank", string(rune('0'+r))))
		if len(lines) != 60 {
			t.Fatalf("rank %d: %d indices", r, len(lines))
		}
		for _, l := range lines {
			if seen[l] {
				t.Fatalf("index %s in both ranks", l)
			}
			seen[l] = true
		}
	}
	var bench []struct {
		Items int `json:"items"`
		Miss  int `json:"misses"`
	}
	if err := json.Unmarshal([]byte(must(n1, "--json", "bench", "train", "--epochs", "1", "--gpu-time", "1ms")), &bench); err != nil ||
		len(bench) != 1 || bench[0].Items != 120 || bench[0].Miss != 0 {
		t.Fatalf("bench: %+v %v", bench, err)
	}
	// A job whose two ranks both run on n1: half its samples live on n2.
	// Through n1 those are peer hits; split by owner they are not.
	must(n1, "jobs", "add", "far", "--dataset", "ds", "--seed", "5", "--world-size", "2", "--batch-size", "8", "--ranks", "n1,n1")
	var far []struct {
		Items int `json:"items"`
		Local int `json:"hits_local"`
		Peer  int `json:"hits_peer"`
		Miss  int `json:"misses"`
	}
	if err := json.Unmarshal([]byte(must(n1, "--json", "bench", "far", "--epochs", "1", "--gpu-time", "1ms")), &far); err != nil ||
		len(far) != 1 || far[0].Items != 120 || far[0].Peer < 30 || far[0].Miss != 0 {
		t.Fatalf("bench of a job on one node: %+v %v; want 120 items, many peer hits", far, err)
	}
	if err := json.Unmarshal([]byte(must(n1, "--json", "bench", "far", "--epochs", "1", "--gpu-time", "1ms", "--route", "owner")), &far); err != nil ||
		len(far) != 1 || far[0].Items != 120 || far[0].Local != 120 || far[0].Peer != 0 || far[0].Miss != 0 {
		t.Fatalf("bench --route owner: %+v %v; want 120 local hits", far, err)
	}
	// The Go client's routed batch: every item byte for byte, in request
	// order, none through a peer.
	before := sumStats(t, []*proc{n1, n2})
	routedClient := client.New("http://"+n2.http, "s3cret").RouteByOwner()
	order := rand.New(rand.NewPCG(4, 4)).Perm(120)
	items, err := routedClient.Batch(context.Background(), "ds", order)
	if err != nil || len(items) != 120 {
		t.Fatalf("routed batch: %d items, %v", len(items), err)
	}
	for x, i := range order {
		if items[x].Key != keys[i] || !bytes.Equal(items[x].Data, files[keys[i]]) {
			t.Fatalf("routed batch position %d (index %d, %s): wrong item", x, i, items[x].Key)
		}
	}
	if after := sumStats(t, []*proc{n1, n2}); after.HitsPeer != before.HitsPeer || after.HitsLocal != before.HitsLocal+120 {
		t.Fatalf("routed batch: %d peer and %d local hits, want 0 and 120", after.HitsPeer-before.HitsPeer, after.HitsLocal-before.HitsLocal)
	}
	var an analyzeOutput
	if err := json.Unmarshal([]byte(must(n1, "--json", "analyze", "ds", "--sample", "50")), &an); err != nil ||
		an.Model.Rates.Cold <= 0 || an.Model.Rates.Cached <= 0 {
		t.Fatalf("analyze: %+v %v", an, err)
	}
	// The what-if drawn: a terminal chart beside the table, and --svg.
	svg := filepath.Join(t.TempDir(), "whatif.svg")
	if out := must(n1, "analyze", "ds", "--sample", "50", "--gpu-rate", "1000", "--svg", svg); !strings.Contains(out, "stall per epoch (s) vs cache size") ||
		!strings.Contains(out, "epoch time (s) vs cache size") || !strings.Contains(out, "chart written to "+svg) {
		t.Fatalf("analyze's chart:\n%s", out)
	}
	if b, err := os.ReadFile(svg); err != nil || !bytes.Contains(b, []byte("<svg")) || !bytes.Contains(b, []byte("minio stall")) {
		t.Fatalf("analyze --svg: %v, %.200s", err, b)
	}
	// Positions ranks report at checkpoints show in jobs ls, from any node.
	if err := n2.c.ReportPosition(context.Background(), "train", api.RankPosition{Rank: 1, Epoch: 3, Position: 16}); err != nil {
		t.Fatal(err)
	}
	if out := must(n1, "jobs", "ls"); !strings.Contains(out, "r1 e3@16") {
		t.Fatalf("jobs ls does not show rank 1's position: %s", out)
	}
	// A resize starts a new generation that keeps the one it replaced.
	var jobs []struct {
		Name    string
		Version uint64
	}
	if err := json.Unmarshal([]byte(must(n1, "--json", "jobs", "ls")), &jobs); err != nil {
		t.Fatal(err)
	}
	var gen0 uint64
	for _, j := range jobs {
		if j.Name == "train" {
			gen0 = j.Version
		}
	}
	if out := must(n2, "jobs", "resize", "train", "--world-size", "1", "--ranks", "n1"); !strings.Contains(out, "1 ranks (was generation") {
		t.Fatalf("jobs resize: %s", out)
	}
	var resized struct {
		WorldSize int `json:"world_size"`
		Previous  struct {
			Generation uint64 `json:"generation"`
			WorldSize  int    `json:"world_size"`
		} `json:"previous"`
	}
	if err := json.Unmarshal([]byte(must(n1, "--json", "jobs", "resize", "train", "--world-size", "1", "--ranks", "n1")), &resized); err != nil ||
		resized.WorldSize != 1 || resized.Previous.WorldSize != 2 || resized.Previous.Generation != gen0 || gen0 == 0 {
		t.Fatalf("jobs resize again (unchanged): %+v %v; want 1 rank after generation %d's 2", resized, err, gen0)
	}
	must(n1, "jobs", "rm", "train")
	must(n2, "datasets", "rm", "ds")
	if out, err := ctl(n1, "datasets", "rm", "ds"); err == nil || !strings.Contains(out, "404") {
		t.Fatalf("second rm: %v %s", err, out)
	}
	// A wrong token is refused with a clear error and exit status 1.
	bad := filepath.Join(t.TempDir(), "bad")
	os.WriteFile(bad, []byte("nope"), 0o600)
	out, err := exec.Command(filepath.Join(binDir, "cachectl"), "--node", "http://"+n1.http, "--token-file", bad, "stats").CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "401") {
		t.Fatalf("wrong token: %v %s", err, out)
	}
	if _, err := exec.Command(filepath.Join(binDir, "cachectl"), "frobnicate").CombinedOutput(); err == nil {
		t.Fatal("unknown command accepted")
	}
}
