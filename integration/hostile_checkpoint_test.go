package integration

import (
	"bytes"
	"io"
	"net/http"
	"testing"
	"time"

	"stallfree/api"
	"stallfree/internal/testutil"
)

// A checkpoint part is bounded by progress, not total time (docs/api.md,
// --idle-timeout): sent steadily for four idle timeouts it is stored on both
// nodes; one that stops for three is cut off and stored nowhere.
func TestSlowPartsAreBoundedByProgress(t *testing.T) {
	testutil.Long(t)
	nodes := startCluster(t, clusterOpts{nodes: 2, extra: []string{"--checkpoint-memory", "16MiB", "--idle-timeout", "1s"}})
	n1, n2 := nodes[0], nodes[1]
	part := randomBytes(11, 2<<20)
	slow := func(pause func(chunk int) time.Duration) (int, error) {
		pr, pw := io.Pipe()
		written := make(chan struct{})
		defer func() { pr.Close(); <-written }()
		go func() {
			defer close(written)
			for c := range 16 { // 128 KiB a chunk
				time.Sleep(pause(c))
				if _, err := pw.Write(part[c<<17 : (c+1)<<17]); err != nil {
					return
				}
			}
			pw.Close()
		}()
		req, _ := http.NewRequest(http.MethodPut, "http://"+n1.http+partPath("slow", 1, "0"), pr)
		req.ContentLength = int64(len(part))
		req.Header.Set(api.HeaderChecksum, sha(part))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	// 16 chunks 250 ms apart: 4 s in all, never 1 s without a byte.
	if code, err := slow(func(int) time.Duration { return 250 * time.Millisecond }); err != nil || code != http.StatusCreated {
		t.Fatalf("a steady part over 4 idle timeouts: %d %v", code, err)
	}
	for _, n := range []*proc{n1, n2} {
		if h := held(t, n, "slow", 1); len(h) != 1 {
			t.Fatalf("%s holds %v of the steady part", n.name, h)
		}
	}
	if code, err := slow(func(c int) time.Duration {
		if c == 8 {
			return 3 * time.Second
		}
		return 0
	}); err == nil && code < 400 {
		t.Fatalf("a part silent for 3 idle timeouts was stored: %d", code)
	}
	if code, body, _ := ckReq(t, n1, http.MethodGet, partPath("slow", 1, "0"), nil, nil); code != http.StatusOK || !bytes.Equal(body, part) {
		t.Fatalf("the steady part after a stalled rewrite: %d, %d bytes", code, len(body))
	}
}
