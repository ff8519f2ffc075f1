package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"

	"stallfree/api"
	"stallfree/internal/testutil"
	"stallfree/miniotest"
)

// Checkpoints in peer memory, on real nodes: pairs over n1..n4 are (n1,n2)
// and (n3,n4).

func randomBytes(seed uint64, n int) []byte {
	r := rand.New(rand.NewPCG(seed, 37))
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

func sha(b []byte) string { s := sha256.Sum256(b); return hex.EncodeToString(s[:]) }

// ckReq sends one request to n's API and returns the status and body.
func ckReq(t *testing.T, n *proc, method, path string, body io.Reader, hdr map[string]string) (int, []byte, http.Header) {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+n.http+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if b, ok := body.(*bytes.Reader); ok {
		req.ContentLength = int64(b.Len())
	}
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s on %s: %v", method, path, n.name, err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s on %s: reading the answer: %v", method, path, n.name, err)
	}
	return resp.StatusCode, out, resp.Header
}

func partPath(name string, step int, part string) string {
	return fmt.Sprintf("/v1/checkpoints/%s/steps/%d/parts/%s", name, step, part)
}

func putPart(t *testing.T, n *proc, name string, step int, part string, data []byte, sum string) (int, string) {
	t.Helper()
	code, body, _ := ckReq(t, n, http.MethodPut, partPath(name, step, part), bytes.NewReader(data), map[string]string{api.HeaderChecksum: sum})
	return code, string(body)
}

func mustPut(t *testing.T, n *proc, name string, step int, part string, data []byte) {
	t.Helper()
	if code, body := putPart(t, n, name, step, part, data, sha(data)); code != http.StatusCreated {
		t.Fatalf("PUT %s step %d part %s on %s: %d %s", name, step, part, n.name, code, body)
	}
}

func commitStep(t *testing.T, n *proc, name string, step int, parts ...string) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(api.CommitCheckpoint{Parts: parts, Meta: json.RawMessage(`{"epoch":1}`)})
	code, body, _ := ckReq(t, n, http.MethodPost, fmt.Sprintf("/v1/checkpoints/%s/steps/%d/commit", name, step), bytes.NewReader(b), nil)
	return code, body
}

// tryInfo is checkpointInfo for waits: false while n does not know the name.
func tryInfo(t *testing.T, n *proc, name string) (api.Checkpoint, bool) {
	t.Helper()
	code, body, _ := ckReq(t, n, http.MethodGet, "/v1/checkpoints/"+name, nil, nil)
	var ck api.Checkpoint
	return ck, code == http.StatusOK && json.Unmarshal(body, &ck) == nil
}

func checkpointInfo(t *testing.T, n *proc, name string) api.Checkpoint {
	t.Helper()
	code, body, _ := ckReq(t, n, http.MethodGet, "/v1/checkpoints/"+name, nil, nil)
	if code != http.StatusOK {
		t.Fatalf("GET checkpoint %s on %s: %d %s", name, n.name, code, body)
	}
	var ck api.Checkpoint
	if err := json.Unmarshal(body, &ck); err != nil {
		t.Fatal(err)
	}
	return ck
}

// readPart reads a part through n and checks it is exactly want; it returns
// which copy answered.
func readPart(t *testing.T, n *proc, name string, step int, part string, want []byte) string {
	t.Helper()
	code, body, h := ckReq(t, n, http.MethodGet, partPath(name, step, part), nil, nil)
	if code != http.StatusOK {
		t.Fatalf("GET %s step %d part %s on %s: %d %s", name, step, part, n.name, code, body)
	}
	if !bytes.Equal(body, want) {
		t.Fatalf("GET %s step %d part %s on %s: %d bytes differ from the %d written", name, step, part, n.name, len(body), len(want))
	}
	if h.Get(api.HeaderChecksum) != sha(want) {
		t.Fatalf("X-Checksum %q, want %s", h.Get(api.HeaderChecksum), sha(want))
	}
	return h.Get("X-Checkpoint-From")
}

func ckUsed(t *testing.T, n *proc) uint64 {
	t.Helper()
	code, body, _ := ckReq(t, n, http.MethodGet, "/v1/stats", nil, nil)
	if code != 200 {
		t.Fatalf("stats of %s: %d", n.name, code)
	}
	var st api.Stats
	if err := json.Unmarshal(body, &st); err != nil || st.Checkpoints == nil {
		t.Fatalf("stats of %s without checkpoints: %s", n.name, body)
	}
	return st.Checkpoints.UsedBytes
}

// held lists the parts of a step n itself holds (the internal route).
func held(t *testing.T, n *proc, name string, step int) []string {
	t.Helper()
	code, body, _ := ckReq(t, n, http.MethodGet, fmt.Sprintf("/v1/internal/checkpoints/%s/steps/%d", name, step), nil, nil)
	if code != 200 {
		t.Fatalf("held on %s: %d %s", n.name, code, body)
	}
	var hs []struct{ Part string }
	json.Unmarshal(body, &hs)
	var out []string
	for _, h := range hs {
		out = append(out, h.Part)
	}
	return out
}

func TestCheckpointPeerMemory(t *testing.T) {
	testutil.Long(t)
	persist := t.TempDir()
	nodes := startCluster(t, clusterOpts{nodes: 4, extra: []string{"--checkpoint-memory", "24MiB",
		"--checkpoint-persist", "dir://" + persist, "--dead-grace", "10m"}})
	n1, n2, n3, n4 := nodes[0], nodes[1], nodes[2], nodes[3]
	p0, p1 := randomBytes(1, 3<<20+17), randomBytes(2, 2<<20+5)

	// Refused writes store nothing anywhere.
	if code, body := putPart(t, n1, "job", 1, "0", p0, "abc"); code != http.StatusBadRequest {
		t.Fatalf("malformed X-Checksum: %d %s", code, body)
	}
	if code, body := putPart(t, n1, "job", 1, "0", p0, sha(p1)); code != http.StatusBadRequest || !strings.Contains(body, "sha256") {
		t.Fatalf("wrong X-Checksum: %d %s", code, body)
	}
	big := randomBytes(3, 25<<20)
	if code, body := putPart(t, n1, "job", 1, "0", big, sha(big)); code != http.StatusInsufficientStorage || !strings.Contains(body, `"error"`) {
		t.Fatalf("a part beyond --checkpoint-memory: %d %s", code, body)
	}
	chunked := io.MultiReader(bytes.NewReader(p0)) // no length: sent chunked
	if code, body, _ := ckReq(t, n1, http.MethodPut, partPath("job", 1, "0"), chunked, map[string]string{api.HeaderChecksum: sha(p0)}); code != http.StatusLengthRequired {
		t.Fatalf("a part without Content-Length: %d %s", code, body)
	}
	if code, body := putPart(t, n1, "job", 1, "../x", p0, sha(p0)); code != http.StatusBadRequest && code != http.StatusNotFound {
		t.Fatalf("a part named ../x: %d %s", code, body)
	}
	for _, n := range nodes {
		if u := ckUsed(t, n); u != 0 {
			t.Fatalf("%s holds %d checkpoint bytes after refused writes", n.name, u)
		}
	}

	// Store, commit, read back byte-exact from every node.
	mustPut(t, n1, "job", 1, "0", p0) // n1 and n2
	mustPut(t, n3, "job", 1, "1", p1) // n3 and n4
	if h := held(t, n2, "job", 1); !slices.Equal(h, []string{"0"}) {
		t.Fatalf("n1's partner n2 holds %v", h)
	}
	if h := held(t, n4, "job", 1); !slices.Equal(h, []string{"1"}) {
		t.Fatalf("n3's partner n4 holds %v", h)
	}
	code, body := commitStep(t, n2, "job", 1, "0", "1", "2")
	var missing api.MissingParts
	if json.Unmarshal(body, &missing); code != http.StatusConflict || !slices.Equal(missing.Missing, []string{"2"}) {
		t.Fatalf("commit naming a part never written: %d %s", code, body)
	}
	if code, body := commitStep(t, n4, "job", 1, "0", "1"); code != http.StatusOK {
		t.Fatalf("commit: %d %s", code, body)
	}
	if code, body := putPart(t, n1, "job", 1, "0", p0, sha(p0)); code != http.StatusConflict {
		t.Fatalf("PUT into a committed step: %d %s", code, body)
	}
	if code, body := commitStep(t, n1, "job", 0, "0"); code != http.StatusConflict {
		t.Fatalf("commit of a step older than the latest: %d %s", code, body)
	}
	testutil.AwaitWithin(t, 10*time.Second, "every node listing step 1", func() bool {
		for _, n := range nodes {
			if ck, ok := tryInfo(t, n, "job"); !ok || ck.Latest == nil || *ck.Latest != 1 {
				return false
			}
		}
		return true
	})
	for _, n := range nodes {
		ck := checkpointInfo(t, n, "job")
		if ck.Latest == nil || *ck.Latest != 1 || len(ck.Steps) != 1 || ck.Steps[0].Replicas != 2 || ck.Steps[0].Bytes != int64(len(p0)+len(p1)) {
			t.Fatalf("listing on %s: %+v", n.name, ck)
		}
		readPart(t, n, "job", 1, "0", p0)
		readPart(t, n, "job", 1, "1", p1)
	}
	if code, _, _ := ckReq(t, n1, http.MethodGet, "/v1/checkpoints/nope", nil, nil); code != http.StatusNotFound {
		t.Fatalf("unknown checkpoint: %d", code)
	}
	if code, _, _ := ckReq(t, n1, http.MethodGet, partPath("job", 1, "7"), nil, nil); code != http.StatusNotFound {
		t.Fatalf("unknown part: %d", code)
	}
	testutil.AwaitWithin(t, 30*time.Second, "step 1 persisted", func() bool { return checkpointInfo(t, n1, "job").Steps[0].Persisted })

	// --checkpoint-keep 2: a third commit drops the oldest step, everywhere.
	small := []byte("small part")
	for step := 1; step <= 3; step++ {
		mustPut(t, n2, "keep", step, "0", small)
		if code, body := commitStep(t, n2, "keep", step, "0"); code != http.StatusOK {
			t.Fatalf("keep step %d: %d %s", step, code, body)
		}
	}
	if ck := checkpointInfo(t, n2, "keep"); len(ck.Steps) != 2 || ck.Steps[0].Step != 2 || *ck.Latest != 3 {
		t.Fatalf("keep 2: %+v", ck) // the committing node reads its own commit
	}
	testutil.AwaitWithin(t, 10*time.Second, "every node listing steps 2 and 3", func() bool {
		for _, n := range nodes {
			if ck, ok := tryInfo(t, n, "keep"); !ok || len(ck.Steps) != 2 || ck.Steps[0].Step != 2 {
				return false
			}
		}
		return true
	})
	testutil.AwaitWithin(t, 10*time.Second, "step 1 of keep freed", func() bool { return len(held(t, n1, "keep", 1))+len(held(t, n2, "keep", 1)) == 0 })
	if code, _, _ := ckReq(t, n3, http.MethodDelete, "/v1/checkpoints/keep", nil, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE: %d", code)
	}
	if code, _, _ := ckReq(t, n3, http.MethodGet, "/v1/checkpoints/keep", nil, nil); code != http.StatusNotFound {
		t.Fatalf("a deleted checkpoint: %d", code)
	}
	testutil.AwaitWithin(t, 10*time.Second, "the deleted checkpoint's parts freed", func() bool {
		return len(held(t, n2, "keep", 2))+len(held(t, n2, "keep", 3))+len(held(t, n1, "keep", 3)) == 0
	})

	// Deleting a name with uploads but no commit drops them on every node.
	mustPut(t, n3, "abandoned", 1, "0", small)
	if code, _, _ := ckReq(t, n1, http.MethodDelete, "/v1/checkpoints/abandoned", nil, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE of uploads: %d", code)
	}
	if h := append(held(t, n3, "abandoned", 1), held(t, n4, "abandoned", 1)...); len(h) != 0 {
		t.Fatalf("uploads left after DELETE: %v", h)
	}
	if code, _, _ := ckReq(t, n1, http.MethodDelete, "/v1/checkpoints/abandoned", nil, nil); code != http.StatusNotFound {
		t.Fatalf("DELETE of nothing: %d", code)
	}

	// A node killed while a part's body is half sent: no commit, the latest
	// step stays 1, and its partner keeps nothing of the cut part.
	q0, q1 := randomBytes(4, 1<<20), randomBytes(5, 4<<20)
	mustPut(t, n1, "job", 2, "0", q0)
	before := ckUsed(t, n4)
	conn, err := net.Dial("tcp", n3.http)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n%s: %s\r\n\r\n", partPath("job", 2, "1"), len(q1), api.HeaderChecksum, sha(q1))
	conn.Write(q1[:len(q1)/2])
	// n4 reserves the part's room when n3 starts passing it on.
	testutil.AwaitWithin(t, 10*time.Second, "n3 streaming to n4", func() bool { return ckUsed(t, n4) > before })
	n3.kill()
	testutil.AwaitWithin(t, 10*time.Second, "n4 dropping the cut part", func() bool { return ckUsed(t, n4) == before })
	if h := held(t, n4, "job", 2); !slices.Equal(h, []string{}) && h != nil {
		t.Fatalf("n4 holds %v of step 2 after its writer died mid-body", h)
	}
	code, body = commitStep(t, n1, "job", 2, "0", "1")
	if json.Unmarshal(body, &missing); code != http.StatusConflict || !slices.Equal(missing.Missing, []string{"1"}) {
		t.Fatalf("commit of the torn step: %d %s", code, body)
	}
	if ck := checkpointInfo(t, n2, "job"); *ck.Latest != 1 {
		t.Fatalf("latest moved to %d after a torn upload", *ck.Latest)
	}

	// One node of the pair (n3) is dead: every part still reads, from the
	// other nodes, byte-exact.
	for _, n := range []*proc{n1, n2, n4} {
		readPart(t, n, "job", 1, "0", p0)
		readPart(t, n, "job", 1, "1", p1)
	}
	// Both nodes of the pair dead: part 1 comes from the persisted copy,
	// though two of four voters leave no raft quorum.
	n4.kill()
	for _, n := range []*proc{n1, n2} {
		if from := readPart(t, n, "job", 1, "1", p1); from != "persisted" {
			t.Fatalf("part 1 on %s came from %q, want the persisted copy", n.name, from)
		}
		readPart(t, n, "job", 1, "0", p0)
		if ck := checkpointInfo(t, n, "job"); *ck.Latest != 1 {
			t.Fatalf("listing without quorum on %s: %+v", n.name, ck)
		}
	}
}

// A holder dead past --dead-grace: the part gets its second copy back on
// the survivor's new partner, and stays readable after the survivor dies.
func TestCheckpointRereplication(t *testing.T) {
	testutil.Long(t)
	nodes := startCluster(t, clusterOpts{nodes: 3, extra: []string{"--checkpoint-memory", "16MiB", "--dead-grace", "1s"}})
	n1, n2, n3 := nodes[0], nodes[1], nodes[2]
	// One group of three: n1 → n2, n2 → n3, n3 → n1. A partner without room
	// refuses the copy (507), and the writer keeps nothing either.
	ten := randomBytes(9, 10<<20)
	mustPut(t, n3, "fill", 1, "0", ten) // n3 and n1
	if code, body := putPart(t, n2, "fill", 1, "1", ten, sha(ten)); code != http.StatusInsufficientStorage || !strings.Contains(body, "partner") {
		t.Fatalf("a part its partner has no room for: %d %s", code, body)
	}
	if u := ckUsed(t, n2); u != 0 {
		t.Fatalf("n2 keeps %d bytes of a part its partner refused", u)
	}
	if code, _, _ := ckReq(t, n1, http.MethodDelete, "/v1/checkpoints/fill", nil, nil); code != http.StatusNoContent {
		t.Fatalf("DELETE fill: %d", code)
	}
	p := randomBytes(6, 1<<20+3)
	mustPut(t, n1, "job", 5, "0", p) // n1 → n2 (n1, n2, n3 form one group of three)
	if code, body := commitStep(t, n3, "job", 5, "0"); code != http.StatusOK {
		t.Fatalf("commit: %d %s", code, body)
	}
	if h := held(t, n3, "job", 5); len(h) != 0 {
		t.Fatalf("n3 holds %v before any repair", h)
	}
	n2.kill()
	testutil.AwaitWithin(t, 30*time.Second, "a second copy on n3", func() bool {
		ck := checkpointInfo(t, n1, "job")
		return ck.Steps[0].Replicas == 2 && len(held(t, n3, "job", 5)) == 1
	})
	n1.kill()
	if from := readPart(t, n3, "job", 5, "0", p); from != "memory" {
		t.Fatalf("read from %q, want n3's own memory", from)
	}
	// Alone, a node has no partner: a part cannot get its two copies.
	testutil.AwaitWithin(t, 30*time.Second, "503 from a lone node", func() bool {
		code, _ := putPart(t, n3, "job", 6, "0", p, sha(p))
		return code == http.StatusServiceUnavailable
	})
}

// Persisting to S3 (a real MinIO server) through the S3 source's client and
// credentials: a failed persist shows in /v1/stats and is retried until it
// succeeds; the object holds exactly the part's bytes.
func TestCheckpointPersistS3(t *testing.T) {
	testutil.Long(t)
	srv := miniotest.Start(t)
	srv.Bucket("ckpt")
	nodes := startCluster(t, clusterOpts{nodes: 2, env: miniotest.CredentialsEnv(), extra: []string{
		"--checkpoint-memory", "16MiB", "--s3-endpoint", srv.Endpoint, "--checkpoint-persist", "s3://ckpt/runs"}})
	n1, n2 := nodes[0], nodes[1]
	p := randomBytes(7, 2<<20+9)
	srv.Stop() // storage down: the persist fails and is retried
	mustPut(t, n2, "job", 1, "0", p)
	if code, body := commitStep(t, n2, "job", 1, "0"); code != http.StatusOK {
		t.Fatalf("commit: %d %s", code, body)
	}
	leaderStats := func() *api.CheckpointStats {
		for _, n := range nodes {
			_, body, _ := ckReq(t, n, http.MethodGet, "/v1/stats", nil, nil)
			var st api.Stats
			if json.Unmarshal(body, &st) == nil && st.Checkpoints != nil && (st.Checkpoints.PersistFailures > 0 || st.Checkpoints.PersistedSteps > 0) {
				return st.Checkpoints
			}
		}
		return nil
	}
	testutil.AwaitWithin(t, 30*time.Second, "a failed persist in /v1/stats", func() bool {
		st := leaderStats()
		return st != nil && st.PersistFailures > 0 && st.PersistError != "" && st.PersistPending == 1
	})
	if checkpointInfo(t, n1, "job").Steps[0].Persisted {
		t.Fatal("persisted while storage is down")
	}
	srv.Restart()
	testutil.AwaitWithin(t, 60*time.Second, "step 1 persisted once storage is back", func() bool {
		ck, ok := tryInfo(t, n1, "job")
		return ok && ck.Steps[0].Persisted
	})
	obj, err := srv.Client.GetObject(context.Background(), "ckpt", "runs/job/1/0", minio.GetObjectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(obj)
	if err != nil || !bytes.Equal(got, p) {
		t.Fatalf("persisted object: %d bytes, err %v; want the part's %d bytes", len(got), err, len(p))
	}
}

// A holder restarted (kill -9, back under its name, empty) gets its copy
// back from its partner at once, long before --dead-grace.
func TestCheckpointRestartedHolder(t *testing.T) {
	testutil.Long(t)
	nodes := startCluster(t, clusterOpts{nodes: 2, extra: []string{"--checkpoint-memory", "16MiB", "--dead-grace", "10m"}})
	n1, n2 := nodes[0], nodes[1]
	p := randomBytes(8, 1<<20+1)
	mustPut(t, n1, "job", 1, "0", p)
	if code, body := commitStep(t, n1, "job", 1, "0"); code != http.StatusOK {
		t.Fatalf("commit: %d %s", code, body)
	}
	n2.kill()
	n2.start()
	testutil.AwaitWithin(t, 60*time.Second, "n2 holding its copy again", func() bool { return len(held(t, n2, "job", 1)) == 1 })
	n1.kill()
	if from := readPart(t, n2, "job", 1, "0", p); from != "memory" {
		t.Fatalf("read from %q, want n2's own memory", from)
	}
}
