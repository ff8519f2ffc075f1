package httpapi

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
	"stallfree/internal/testutil"
)

// BenchmarkLocalHit GETs resident items by key (32-96 KiB, so they leave by
// the writev path as `make bench`'s do) over one keep-alive connection and
// reports what the whole process allocates per hit (the client here reuses
// its buffers, so allocs/op is the server's):
//
//	go test -run '^$' -bench LocalHit -benchmem ./httpapi
//
// Every byte a hit allocates is garbage the collector must later find, and
// until the heap reaches its limit it lands in pages never touched before.
func BenchmarkLocalHit(b *testing.B) {
	const items = 64
	h := start(b, items, 64<<10, 64<<20, "minio", "")
	c, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	reqs := make([][]byte, items)
	reqs = reqs[:0]
	for _, key := range h.keys {
		// Plain keys in a folder, like make bench's (a few test names have
		// characters that need escaping).
		if strings.HasPrefix(key, "class") {
			reqs = append(reqs, fmt.Appendf(nil, "GET /v1/datasets/ds/items/%s HTTP/1.1\r\nHost: bench\r\n\r\n", key))
		}
	}
	get := func(i int) {
		req := reqs[i%len(reqs)]
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		if err := discardResponse(br); err != nil {
			b.Fatalf("%s: %v", req, err)
		}
	}
	for i := range reqs { // fill the cache: every later GET is a hit
		get(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		get(i)
	}
}

// discardResponse reads one 200 response with a Content-Length body.
func discardResponse(br *bufio.Reader) error {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return err
	}
	if !bytes.HasPrefix(line, []byte("HTTP/1.1 200")) {
		return fmt.Errorf("status %q", bytes.TrimSpace(line))
	}
	n := -1
	for {
		if line, err = br.ReadSlice('\n'); err != nil {
			return err
		}
		if len(line) <= 2 {
			break
		}
		if v, ok := bytes.CutPrefix(line, []byte("Content-Length: ")); ok {
			n, _ = strconv.Atoi(string(bytes.TrimSpace(v)))
		}
	}
	if n < 0 {
		return fmt.Errorf("no Content-Length")
	}
	_, err = br.Discard(n)
	return err
}

// BenchmarkBatchWrite PUTs the same batch of 16 prep-cache items of
// 256×256×3 bytes (3 MiB) to a derived dataset over one keep-alive
// connection: after the first, each is a write of bytes already held (200),
// so what an op costs is reading, decoding and checking the body, the part
// a first fill pays before the store's copy.
//
//	go test -run '^$' -bench BatchWrite -benchmem ./httpapi
//
// B/op is what the server allocates for a body (the client here reuses its
// request): before the body was recycled and read in place, two copies of
// it.
func BenchmarkBatchWrite(b *testing.B) {
	h := start(b, 16, 100, 64<<20, "minio", "")
	if r := h.do("PUT", "/v1/datasets/dec", []byte(`{"derived_from":"ds","stage":"bench"}`)); r.status != 201 {
		b.Fatalf("derive: %d %s", r.status, r.body)
	}
	batch := make([]api.ItemWrite, 16)
	for i := range batch {
		batch[i] = api.ItemWrite{Index: i, Data: bytes.Repeat([]byte{byte(i)}, 256*256*3)}
	}
	body, err := msgpack.Marshal(batch)
	if err != nil {
		b.Fatal(err)
	}
	c, err := net.Dial("tcp", strings.TrimPrefix(h.base, "http://"))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	req := append(fmt.Appendf(nil, "PUT /v1/datasets/dec/batch HTTP/1.1\r\nHost: bench\r\nContent-Type: application/msgpack\r\nContent-Length: %d\r\n\r\n", len(body)), body...)
	put := func() {
		if _, err := c.Write(req); err != nil {
			b.Fatal(err)
		}
		if err := discardResponse(br); err != nil {
			b.Fatal(err)
		}
	}
	put() // written once; every later op finds the same bytes held
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := testutil.ProcessCPU(b)
	for range b.N {
		put()
	}
	// The whole process's CPU (the client here and the node), beside the
	// wall time: what an op costs survives a change of machine.
	b.ReportMetric(float64((testutil.ProcessCPU(b)-cpu0).Microseconds())/1e3/float64(b.N), "cpu-ms/op")
}
