// Package bench measures Stallfree against nginx, memcached and the
// hardware on the same data, in one run, alternating targets so that ratios
// survive a noisy machine. `make bench` runs it through cmd/sfbench.
package bench

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Target is something to send load to: a server process and a request shape.
type Target struct {
	Name string
	Addr string
	// Addrs, when set, are several servers: each worker holds a connection
	// to every one, and do picks (conn.peers) per request.
	Addrs []string
	PIDs  func() []int // server processes whose CPU is charged to the target
	Items int          // items per request (64 for a batch)
	// Parts names the server processes whose CPU is also reported one by one
	// (the requester and the owner of a peer hit).
	Parts map[string]func() []int
	// do sends one request on a connection and returns the payload bytes read.
	do func(c *conn, r *rand.Rand) (int, error)
}

type conn struct {
	net.Conn
	br *bufio.Reader
	bw *bufio.Writer
	// peers are this worker's connections to Target.Addrs, in their order.
	peers []*conn
}

func dialConn(addr string) (*conn, error) {
	nc, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return nil, err
	}
	return &conn{Conn: nc, br: bufio.NewReaderSize(nc, 256<<10), bw: bufio.NewWriterSize(nc, 4<<10)}, nil
}

// Result of one load run.
type Result struct {
	Target      string  `json:"target"`
	Conc        int     `json:"concurrency"`
	Requests    int     `json:"requests"`
	Items       int     `json:"items"`
	Errors      int     `json:"errors"`
	Seconds     float64 `json:"seconds"`
	ReqPerSec   float64 `json:"req_per_s"`
	ItemsPerSec float64 `json:"items_per_s"`
	MBPerSec    float64 `json:"mb_per_s"`
	P50us       float64 `json:"p50_us"`
	P99us       float64 `json:"p99_us"`
	CPUusPerReq float64 `json:"server_cpu_us_per_req"`
	// CPUParts is CPUusPerReq for each of Target.Parts.
	CPUParts map[string]float64 `json:"server_cpu_us_per_req_by_part,omitempty"`
}

// Run sends load with conc connections for d and measures it.
func Run(t *Target, conc int, d time.Duration) (Result, error) {
	conns := make([]*conn, conc)
	addrs := t.Addrs
	if len(addrs) == 0 {
		addrs = []string{t.Addr}
	}
	for i := range conns {
		for _, addr := range addrs {
			c, err := dialConn(addr)
			if err != nil {
				return Result{}, fmt.Errorf("%s: %w", t.Name, err)
			}
			defer c.Close()
			if conns[i] == nil {
				conns[i] = c
			}
			conns[i].peers = append(conns[i].peers, c)
		}
	}
	cpu0 := cpuTicks(t.PIDs())
	parts0 := map[string]int64{}
	for name, pids := range t.Parts {
		parts0[name] = cpuTicks(pids())
	}
	start := time.Now()
	deadline := start.Add(d)
	var wg sync.WaitGroup
	lat := make([][]time.Duration, conc)
	bytesRead := make([]int64, conc)
	errs := make([]int, conc)
	for w := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := rand.New(rand.NewPCG(uint64(w), uint64(start.UnixNano())))
			lat[w] = make([]time.Duration, 0, 1<<16)
			for time.Now().Before(deadline) {
				t0 := time.Now()
				n, err := t.do(conns[w], r)
				if err != nil {
					errs[w]++
					return
				}
				lat[w] = append(lat[w], time.Since(t0))
				bytesRead[w] += int64(n)
			}
		}()
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	cpu1 := cpuTicks(t.PIDs())
	parts1 := map[string]int64{}
	for name, pids := range t.Parts {
		parts1[name] = cpuTicks(pids())
	}
	var all []time.Duration
	var total int64
	res := Result{Target: t.Name, Conc: conc, Seconds: el}
	for w := range conc {
		all = append(all, lat[w]...)
		total += bytesRead[w]
		res.Errors += errs[w]
	}
	slices.Sort(all)
	res.Requests = len(all)
	res.Items = res.Requests * max(t.Items, 1)
	res.ReqPerSec = float64(res.Requests) / el
	res.ItemsPerSec = float64(res.Items) / el
	res.MBPerSec = float64(total) / el / 1e6
	if len(all) > 0 {
		res.P50us = float64(all[len(all)/2].Microseconds())
		res.P99us = float64(all[len(all)*99/100].Microseconds())
		perReq := func(ticks int64) float64 { return float64(ticks) / clkTck * 1e6 / float64(res.Requests) }
		res.CPUusPerReq = perReq(cpu1 - cpu0)
		for name := range t.Parts {
			if res.CPUParts == nil {
				res.CPUParts = map[string]float64{}
			}
			res.CPUParts[name] = perReq(parts1[name] - parts0[name])
		}
	}
	if res.Errors > 0 && res.Requests == 0 {
		return res, fmt.Errorf("%s: every request failed", t.Name)
	}
	return res, nil
}

const clkTck = 100 // Linux USER_HZ

// cpuTicks sums user+system ticks of the processes.
func cpuTicks(pids []int) int64 {
	var n int64
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the parenthesised command name; utime and stime are 14 and 15.
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
		if len(f) > 13 {
			u, _ := strconv.ParseInt(f[11], 10, 64)
			st, _ := strconv.ParseInt(f[12], 10, 64)
			n += u + st
		}
	}
	return n
}

// HTTPGet targets GET requests for random paths.
func HTTPGet(name, addr string, pids func() []int, paths []string, header string) *Target {
	reqs := make([][]byte, len(paths))
	for i, p := range paths {
		reqs[i] = []byte("GET " + p + " HTTP/1.1\r\nHost: bench\r\n" + header + "\r\n")
	}
	return &Target{Name: name, Addr: addr, PIDs: pids, Items: 1, do: func(c *conn, r *rand.Rand) (int, error) {
		c.bw.Write(reqs[r.IntN(len(reqs))])
		if err := c.bw.Flush(); err != nil {
			return 0, err
		}
		return readHTTP(c.br)
	}}
}

// HTTPGetRouted targets GETs to several servers: request i of paths goes to
// addrs[route[i]] (a client that knows every item's owner).
func HTTPGetRouted(name string, addrs []string, pids func() []int, paths []string, route []int) *Target {
	reqs := make([][]byte, len(paths))
	for i, p := range paths {
		reqs[i] = []byte("GET " + p + " HTTP/1.1\r\nHost: bench\r\n\r\n")
	}
	return &Target{Name: name, Addrs: addrs, PIDs: pids, Items: 1, do: func(c *conn, r *rand.Rand) (int, error) {
		i := r.IntN(len(reqs))
		pc := c.peers[route[i]]
		pc.bw.Write(reqs[i])
		if err := pc.bw.Flush(); err != nil {
			return 0, err
		}
		return readHTTP(pc.br)
	}}
}

// HTTPPost targets POST requests with bodies from gen.
func HTTPPost(name, addr string, pids func() []int, path string, items int, header string, gen func(r *rand.Rand) []byte) *Target {
	return &Target{Name: name, Addr: addr, PIDs: pids, Items: items, do: func(c *conn, r *rand.Rand) (int, error) {
		body := gen(r)
		fmt.Fprintf(c.bw, "POST %s HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: %d\r\n%s\r\n", path, len(body), header)
		c.bw.Write(body)
		if err := c.bw.Flush(); err != nil {
			return 0, err
		}
		return readHTTP(c.br)
	}}
}

var errStatus = errors.New("non-200 status")

// readHTTP reads one response with a Content-Length body and discards it.
func readHTTP(br *bufio.Reader) (int, error) {
	line, err := br.ReadSlice('\n')
	if err != nil {
		return 0, err
	}
	if !bytes.HasPrefix(line, []byte("HTTP/1.1 200")) {
		return 0, fmt.Errorf("%w: %q", errStatus, bytes.TrimSpace(line))
	}
	n := -1
	for {
		line, err = br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		if len(line) <= 2 {
			break
		}
		if len(line) > 16 && bytes.EqualFold(line[:15], []byte("Content-Length:")) {
			n, _ = strconv.Atoi(string(bytes.TrimSpace(line[15:])))
		}
	}
	if n < 0 {
		return 0, errors.New("no Content-Length")
	}
	_, err = br.Discard(n)
	return n, err
}

// Memcached targets "get key" on the text protocol.
func Memcached(name, addr string, pids func() []int, keys []string) *Target {
	reqs := make([][]byte, len(keys))
	for i, k := range keys {
		reqs[i] = []byte("get " + k + "\r\n")
	}
	return &Target{Name: name, Addr: addr, PIDs: pids, Items: 1, do: func(c *conn, r *rand.Rand) (int, error) {
		c.bw.Write(reqs[r.IntN(len(reqs))])
		if err := c.bw.Flush(); err != nil {
			return 0, err
		}
		line, err := c.br.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		f := bytes.Fields(line)
		if len(f) != 4 || string(f[0]) != "VALUE" {
			return 0, fmt.Errorf("memcached: %q", line)
		}
		n, _ := strconv.Atoi(string(f[3]))
		if _, err := c.br.Discard(n + 2); err != nil {
			return 0, err
		}
		if _, err := c.br.Discard(5); err != nil { // END\r\n
			return 0, err
		}
		return n, nil
	}}
}

// RawTCP targets a server that answers every byte with size bytes: the
// loopback ceiling for request/response of one item.
func RawTCP(name, addr string, pids func() []int, size int) *Target {
	return &Target{Name: name, Addr: addr, PIDs: pids, Items: 1, do: func(c *conn, r *rand.Rand) (int, error) {
		c.bw.WriteByte('x')
		if err := c.bw.Flush(); err != nil {
			return 0, err
		}
		_, err := c.br.Discard(size)
		return size, err
	}}
}

// ServeRaw answers each byte read with one buffer of size bytes.
func ServeRaw(ln net.Listener, size int) error {
	buf := make([]byte, size)
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer c.Close()
			one := make([]byte, 1)
			for {
				if _, err := io.ReadFull(c, one); err != nil {
					return
				}
				if _, err := c.Write(buf); err != nil {
					return
				}
			}
		}()
	}
}

// Memcpy measures copying size-byte buffers from DRAM (a working set far
// larger than the caches), in GB/s.
func Memcpy(size int, d time.Duration) float64 {
	const set = 512 << 20
	src := make([]byte, set)
	for i := range src {
		src[i] = byte(i)
	}
	dst := make([]byte, size)
	var n int64
	start := time.Now()
	for off := 0; time.Since(start) < d; off = (off + size) % (set - size) {
		copy(dst, src[off:off+size])
		n += int64(size)
	}
	return float64(n) / time.Since(start).Seconds() / 1e9
}
