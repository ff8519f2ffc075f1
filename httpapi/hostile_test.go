package httpapi

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/clusterauth"
	"stallfree/node"
	"stallfree/relay"
)

// Hostile callers of the routes in general (docs/api.md, "Rules every route
// keeps"). The checkpoint, group and loader routes have their own files.

// A request without the token is answered 401 before its body is read
// (fasthttp reads the first 8 KiB with the headers): the node answers while
// the sender still has 64 MiB to send, whatever
// the route (a group batch, a derived item, a batch request, a part, one no
// route serves), and closes the connection after a small drain.
func TestUnauthorizedBodiesAreNotRead(t *testing.T) {
	h := start(t, 4, 100, 1<<20, "lru", "tok")
	if r := h.do("PUT", "/v1/datasets/dec", []byte(`{"derived_from":"ds","stage":"s"}`)); r.status != 201 {
		t.Fatalf("derive: %d %s", r.status, r.body)
	}
	for _, c := range []struct{ method, path, auth string }{
		{"PUT", "/v1/groups/g/epochs/0/batches/0", ""},
		{"PUT", "/v1/datasets/dec/index/0", "Bearer wrong"},
		{"POST", "/v1/datasets/ds/batch", ""},
		{"PUT", "/v1/checkpoints/c/steps/1/parts/0", "Bearer wrong"},
		{"PUT", "/v1/no/such/route", ""},
		{"POST", "/not-v1-at-all", ""},
	} {
		t.Run(c.method+c.path, func(t *testing.T) {
			conn, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			auth := ""
			if c.auth != "" {
				auth = "Authorization: " + c.auth + "\r\n"
			}
			const promised = 64 << 20
			fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: x\r\n%sContent-Type: multipart/form-data; boundary=b\r\nContent-Length: %d\r\n\r\n",
				c.method, c.path, auth, promised)
			conn.Write(bytes.Repeat([]byte("x"), 16<<10)) // and nothing more
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer while the body was unsent (so the node waits for it): %v", err)
			}
			io.Copy(io.Discard, resp.Body)
			if resp.StatusCode != 401 || resp.Header.Get("WWW-Authenticate") != "Bearer" {
				t.Fatalf("status %d, WWW-Authenticate %q; want 401 Bearer", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
			}
			if rest, err := io.ReadAll(br); err != nil || len(rest) > 0 || !resp.Close {
				t.Fatalf("the connection stayed open after a refusal (%v, then %q): the rest of the body would be read", err, rest)
			}
		})
	}
}

// "Expect: 100-continue" invites the body only from a caller with the
// token: without it the node answers 401 at once, never 100 Continue, and
// closes; with it, 100 Continue, then the body is read and stored.
func TestContinueOnlyWithTheToken(t *testing.T) {
	h := start(t, 4, 100, 1<<20, "lru", "tok")
	if r := h.do("PUT", "/v1/datasets/dec", []byte(`{"derived_from":"ds","stage":"s"}`)); r.status != 201 {
		t.Fatalf("derive: %d %s", r.status, r.body)
	}
	expect := func(method, path, auth string) (*bufio.Reader, net.Conn) {
		conn, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if auth != "" {
			auth = "Authorization: " + auth + "\r\n"
		}
		fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: x\r\n%sContent-Length: 5\r\nExpect: 100-continue\r\n\r\n", method, path, auth)
		conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		return bufio.NewReader(conn), conn
	}
	for _, c := range []struct{ method, path, auth string }{
		{"PUT", "/v1/datasets/dec/index/0", ""},
		{"PUT", "/v1/datasets/dec/index/0", "Bearer wrong"},
		{"PUT", "/v1/checkpoints/c/steps/1/parts/0", "Bearer wrong"},
		{"PUT", "/v1/no/such/route", ""},
	} {
		br, _ := expect(c.method, c.path, c.auth)
		line, err := br.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "HTTP/1.1 401") {
			t.Fatalf("%s %s (auth %q): %q %v; want 401 before any 100 Continue", c.method, c.path, c.auth, line, err)
		}
	}
	if r := h.do("GET", "/v1/datasets/dec/index/0", nil); r.status != 404 {
		t.Fatalf("item 0 after the refusals: %d %s", r.status, r.body)
	}
	br, conn := expect("PUT", "/v1/datasets/dec/index/0", "Bearer tok")
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100") {
		t.Fatalf("with the token: %q %v; want 100 Continue", line, err)
	}
	if blank, err := br.ReadString('\n'); err != nil || blank != "\r\n" {
		t.Fatalf("after 100 Continue: %q %v", blank, err)
	}
	conn.Write([]byte("hello"))
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 201 {
		t.Fatalf("the body after 100 Continue: %v %v", resp, err)
	}
	if r := h.do("GET", "/v1/datasets/dec/index/0", nil); r.status != 200 || string(r.body) != "hello" {
		t.Fatalf("item 0: %d %q", r.status, r.body)
	}
}

// Bodies read whole are bounded over all connections (MaxBodyBytes): a
// body is charged what it will hold before a byte is read (on these write
// routes the recycled buffer it is read into: its power-of-two class), so
// while one sender holds part of the bound a second large body is refused
// with 503 at once (nothing stored; by its length alone it would have
// fitted), a small one still fits, and the charge comes back when the first
// ends. A body over the whole bound is read alone. The attack round made a
// node hold 1.4 GB this way with six slow senders.
func TestBodiesReadWholeAreBounded(t *testing.T) {
	const bound = 1 << 20
	dir, files := writeDataset(t, 8, 10)
	h := startOn(t, dir, files, 64<<20, "lru", "tok", func(s *Server, _ *node.Node) { s.MaxBodyBytes = bound })
	if r := h.do("PUT", "/v1/datasets/dec", []byte(`{"derived_from":"ds","stage":"s"}`)); r.status != 201 {
		t.Fatalf("derive: %d %s", r.status, r.body)
	}
	charged := func(want string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			m := h.do("GET", "/metrics", nil)
			if bytes.Contains(m.body, []byte("\nstallfree_http_body_bytes "+want+"\n")) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("stallfree_http_body_bytes never became %s", want)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	slow, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	const slowSize = bound/4 + 1 // read into a buffer of bound/2
	fmt.Fprintf(slow, "PUT /v1/datasets/dec/index/0 HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer tok\r\nContent-Length: %d\r\n\r\n", slowSize)
	slow.Write(bytes.Repeat([]byte("s"), 16<<10)) // and the rest later
	charged(strconv.Itoa(bound / 2))
	r := h.do("PUT", "/v1/datasets/dec/index/1", bytes.Repeat([]byte("b"), bound/2+1)) // a buffer of bound
	if r.status != 503 || r.header.Get("Retry-After") == "" {
		t.Fatalf("a body past the bound: %d %s (Retry-After %q)", r.status, r.body, r.header.Get("Retry-After"))
	}
	if r := h.do("PUT", "/v1/datasets/dec/index/2", bytes.Repeat([]byte("c"), bound/4)); r.status != 201 {
		t.Fatalf("a body within the bound: %d %s", r.status, r.body)
	}
	slow.Write(bytes.Repeat([]byte("s"), slowSize-16<<10))
	slow.SetReadDeadline(time.Now().Add(10 * time.Second))
	if resp, err := http.ReadResponse(bufio.NewReader(slow), nil); err != nil || resp.StatusCode != 201 {
		t.Fatalf("the slow body, once sent: %v %v", resp, err)
	}
	charged("0")
	for i, size := range map[int]int{1: bound/2 + 1, 3: 2 * bound} { // the refused one again; one over the bound, alone
		want := bytes.Repeat([]byte{byte('0' + i)}, size)
		if r := h.do("PUT", fmt.Sprintf("/v1/datasets/dec/index/%d", i), want); r.status != 201 {
			t.Fatalf("item %d (%d bytes) with nothing else in flight: %d %s", i, size, r.status, r.body)
		}
		if r := h.do("GET", fmt.Sprintf("/v1/datasets/dec/index/%d", i), nil); !bytes.Equal(r.body, want) {
			t.Fatalf("item %d reads %d bytes", i, len(r.body))
		}
	}
}

// Without the token every path answers alike, so statuses do not map the
// routes; with it, an unknown route is a 404. The probes stay open.
func TestUnauthorizedPathsAnswerAlike(t *testing.T) {
	h := start(t, 2, 10, 1<<20, "lru", "tok")
	for _, path := range []string{"/v1/datasets", "/v1/no/such/route", "/v1/internal/checkpoints/c/steps/1", "/v2/anything", "/favicon.ico"} {
		for _, method := range []string{"GET", "DELETE"} {
			if r := h.do(method, path, nil, "Authorization", "Bearer nope"); r.status != 401 || string(r.body) != `{"error":"missing or wrong bearer token"}` {
				t.Errorf("%s %s without the token: %d %s", method, path, r.status, r.body)
			}
		}
	}
	if r := h.do("GET", "/v1/no/such/route", nil); r.status != 404 {
		t.Errorf("an unknown route with the token: %d %s", r.status, r.body)
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if r := h.do("GET", path, nil, "Authorization", "Bearer nope"); r.status != 200 {
			t.Errorf("%s without the token: %d", path, r.status)
		}
	}
}

// A streamed body is bounded by progress, not by its total time: one that
// keeps arriving in small pieces for several idle timeouts is stored whole,
// and one that stops for longer than the idle timeout is cut off and stores
// nothing.
func TestIdleTimeoutIsOnProgress(t *testing.T) {
	const idle = 300 * time.Millisecond
	dir, files := writeDataset(t, 4, 100)
	h := startOn(t, dir, files, 64<<20, "minio", "tok", func(s *Server, _ *node.Node) { s.IdleTimeout = idle })
	if r := h.do("PUT", "/v1/datasets/dec", []byte(`{"derived_from":"ds","stage":"s"}`)); r.status != 201 {
		t.Fatalf("derive: %d %s", r.status, r.body)
	}
	// fasthttp reads a body's first 8 KiB with the headers, under the
	// headers' timeout; the rest is what the idle timeout is about.
	const head = 10 << 10
	body := bytes.Repeat([]byte("0123456789"), 2000)
	slowPut := func(index int, pause func(piece int) time.Duration) (int, error) {
		pr, pw := io.Pipe()
		written := make(chan struct{})
		defer func() { pr.Close(); <-written }() // the writer ends before the test does
		go func() {
			defer close(written)
			pw.Write(body[:head])
			for i := range 10 {
				time.Sleep(pause(i))
				if _, err := pw.Write(body[head+i*(len(body)-head)/10 : head+(i+1)*(len(body)-head)/10]); err != nil {
					return
				}
			}
			pw.Close()
		}()
		req, _ := http.NewRequest("PUT", fmt.Sprintf("%s/v1/datasets/dec/index/%d", h.base, index), pr)
		req.ContentLength = int64(len(body))
		req.Header.Set("Authorization", "Bearer tok")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	// 10 pieces 100 ms apart: over 3 idle timeouts in all, never one idle.
	if code, err := slowPut(0, func(int) time.Duration { return idle / 3 }); err != nil || code != 201 {
		t.Fatalf("a slow but steady body: %d %v", code, err)
	}
	if r := h.do("GET", "/v1/datasets/dec/index/0", nil); r.status != 200 || !bytes.Equal(r.body, body) {
		t.Fatalf("the slow body read back: %d, %d bytes", r.status, len(r.body))
	}
	// One pause of 3 idle timeouts halfway.
	code, err := slowPut(1, func(i int) time.Duration {
		if i == 5 {
			return 3 * idle
		}
		return 0
	})
	if err == nil && code < 400 {
		t.Fatalf("a body silent for 3 idle timeouts was accepted: %d", code)
	}
	if r := h.do("GET", "/v1/datasets/dec/index/1", nil); r.status != 404 {
		t.Fatalf("the cut-off body left an item: %d %s", r.status, r.body)
	}
}

// A response is bounded by progress too: a client taking a large item
// slowly but steadily for several idle timeouts gets all of it, and one
// that stops taking bytes for longer than the idle timeout is cut off.
func TestResponseTimeoutIsOnProgress(t *testing.T) {
	// The deadline moves at each 1 MiB chunk's start, so a chunk must drain
	// within an idle timeout: at 300 ms, the steady reader (in this process,
	// under -race) once drained only 619 KB in 318 ms and was cut off.
	const idle = time.Second
	dir, files := writeFiles(t, 1, func() int { return 16 << 20 })
	want := files["with space.bin"]
	h := startOn(t, dir, files, 64<<20, "lru", "tok", func(s *Server, _ *node.Node) { s.IdleTimeout = idle })
	if r := h.do("GET", "/v1/datasets/ds/index/0", nil); r.status != 200 || !bytes.Equal(r.body, want) {
		t.Fatalf("the item read at once: %d, %d bytes", r.status, len(r.body))
	}
	// slowGet reads the item 256 KiB at a time, after pause(bytes so far);
	// a small receive buffer keeps the rest waiting on the node's side.
	slowGet := func(pause func(got int) time.Duration) ([]byte, error) {
		c, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetReadDeadline(time.Now().Add(40 * idle)) // a broken node fails the test instead of blocking it
		c.(*net.TCPConn).SetReadBuffer(64 << 10)
		fmt.Fprintf(c, "GET /v1/datasets/ds/index/0 HTTP/1.1\r\nHost: node\r\nAuthorization: Bearer tok\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			return nil, err
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("slow GET: %d", resp.StatusCode)
		}
		var body []byte
		buf := make([]byte, 256<<10)
		for {
			time.Sleep(pause(len(body)))
			n, err := io.ReadFull(resp.Body, buf)
			body = append(body, buf[:n]...)
			if err == io.EOF || (err == io.ErrUnexpectedEOF && len(body) == int(resp.ContentLength)) {
				return body, nil
			}
			if err != nil {
				return body, err
			}
		}
	}
	// 64 reads ~62 ms apart: four idle timeouts in all, never one idle (a
	// 1 MiB chunk of the node's drains in ~250 ms).
	body, err := slowGet(func(int) time.Duration { return idle / 16 })
	if err != nil || !bytes.Equal(body, want) {
		t.Fatalf("a slow but steady reader: %d of %d bytes, %v", len(body), len(want), err)
	}
	// Silent for four idle timeouts after its first MiB.
	body, err = slowGet(func(got int) time.Duration {
		if got == 1<<20 {
			return 4 * idle
		}
		return 0
	})
	if err == nil || len(body) >= len(want) {
		t.Fatalf("a reader silent for 4 idle timeouts got %d of %d bytes (err %v): not cut off", len(body), len(want), err)
	}
	if r := h.do("GET", "/v1/datasets/ds/index/0", nil); r.status != 200 || !bytes.Equal(r.body, want) {
		t.Fatalf("the item after the cut-off response: %d, %d bytes", r.status, len(r.body))
	}
}

// The internal routes act on a node's own copies: the token, which clients
// hold too, is not enough; a member's proof made with the cluster key is.
func TestInternalRoutesWantAMemberProof(t *testing.T) {
	h := start(t, 2, 10, 1<<20, "lru", "tok")
	path := "/v1/internal/checkpoints/c/steps/1/parts/0/copy?to=169.254.169.254:80"
	if r := h.do("POST", path, nil); r.status != 403 {
		t.Fatalf("an internal route with the token only: %d %s", r.status, r.body)
	}
	key := h.node.MemberKey()
	if len(key) == 0 {
		t.Fatal("a node with a cluster key has no member key")
	}
	stale := clusterauth.SignRequest(key, "POST", path, "t2", time.Now().Add(-clusterauth.RequestSkew-time.Minute))
	if r := h.do("POST", path, nil, api.HeaderForwarded, "t2", clusterauth.HeaderMember, stale); r.status != 403 {
		t.Fatalf("a stale proof: %d %s", r.status, r.body)
	}
	other := clusterauth.SignRequest(key, "POST", "/v1/internal/checkpoints/c/steps/1", "t2", time.Now())
	if r := h.do("POST", path, nil, api.HeaderForwarded, "t2", clusterauth.HeaderMember, other); r.status != 403 {
		t.Fatalf("a proof for another path: %d %s", r.status, r.body)
	}
	// A live member's own client gets past the check (to a node serving no
	// checkpoints: 404); a right proof from a name gossip does not see alive
	// (a node that left still has the key) does not.
	for from, want := range map[string]int{"t1": 404, "t2": 403} {
		resp, err := relay.New(from, "tok", relay.MemberKey(key)).Do(context.Background(), "POST", strings.TrimPrefix(h.base, "http://"), path, nil, 0, nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Fatalf("a request signed by %s: %d, want %d", from, resp.StatusCode, want)
		}
	}
}

// A request marked as relayed makes a node act on it as a peer's (write an
// item it does not own, commit a step without asking the owner): with a
// cluster key the mark needs a member's proof, on every route. A client
// that sets it alone gets a 403 and changes nothing; a node's relay
// (relay.Client.Forward, signed) goes through.
func TestTheRelayMarkWantsAMemberProof(t *testing.T) {
	h := start(t, 2, 10, 1<<20, "lru", "tok")
	if r := h.do("PUT", "/v1/datasets/dec", []byte(`{"derived_from":"ds","stage":"s"}`)); r.status != 201 {
		t.Fatalf("derive: %d %s", r.status, r.body)
	}
	key := h.node.MemberKey()
	wrong := clusterauth.SignRequest(key, "PUT", "/v1/datasets/dec/index/0", "t1", time.Now())
	for name, header := range map[string][]string{
		"the mark alone":      {api.HeaderForwarded, "t1"},
		"a proof for another": {api.HeaderForwarded, "t1", clusterauth.HeaderMember, wrong},
	} {
		if r := h.do("PUT", "/v1/datasets/dec/index/1", []byte("forged"), header...); r.status != 403 {
			t.Fatalf("%s: %d %s", name, r.status, r.body)
		}
		if r := h.do("PUT", "/v1/datasets/dec/batch", []byte{0x90}, header...); r.status != 403 {
			t.Fatalf("%s, a batch: %d %s", name, r.status, r.body)
		}
	}
	if r := h.do("GET", "/v1/datasets/dec/index/1", nil); r.status != 404 {
		t.Fatalf("a refused relay wrote item 1: %d %s", r.status, r.body)
	}
	peers := relay.New("t1", "tok", relay.MemberKey(key))
	defer peers.Close()
	in, out := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(in)
	defer fasthttp.ReleaseResponse(out)
	in.Header.SetMethod("PUT")
	in.Header.Set("Authorization", "Bearer tok")
	in.SetBody([]byte("relayed"))
	if err := peers.Forward(context.Background(), strings.TrimPrefix(h.base, "http://"), "/v1/datasets/dec/index/1", in, out, nil, 1<<16); err != nil || out.StatusCode() != 201 {
		t.Fatalf("a member's relay: %v, %d %s", err, out.StatusCode(), out.Body())
	}
	if r := h.do("GET", "/v1/datasets/dec/index/1", nil); r.status != 200 || string(r.body) != "relayed" {
		t.Fatalf("item 1 after the member's relay: %d %q", r.status, r.body)
	}
}
