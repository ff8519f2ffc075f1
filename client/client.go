// Package client is a Go client for a node's HTTP API (docs/api.md), used by
// cachectl, the loader simulation and the integration tests.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"stallfree/api"
)

// Client talks to one node.
type Client struct {
	Base  string // e.g. http://127.0.0.1:7070
	Token string
	HTTP  *http.Client

	route *ownerRoute // nil: every request goes to Base
	// busyBackoff is the first wait before retrying a 503 (0: busyBackoff).
	busyBackoff time.Duration
}

// ownerRoute is what RouteByOwner keeps: owner tables by dataset and a
// client per member.
type ownerRoute struct {
	mu     sync.Mutex
	tables map[string]api.Owners
	nodes  map[string]*Client // by HTTP address
}

// RouteByOwner makes ItemByIndex ask the node that owns the index (from the
// dataset's owner table, refreshed when a node answers with another X-Ring),
// falling back to Base on any failure. Call it before sharing the client.
func (c *Client) RouteByOwner() *Client {
	c.route = &ownerRoute{tables: map[string]api.Owners{}, nodes: map[string]*Client{}}
	return c
}

// Owners fetches a dataset's owner table.
func (c *Client) Owners(ctx context.Context, dataset string) (api.Owners, error) {
	var o api.Owners
	err := c.msgpack(ctx, http.MethodGet, "/v1/datasets/"+url.PathEscape(dataset)+"/owners", nil, &o)
	return o, err
}

// ownerOf is the client of index i's owner, or nil (no table, no address).
func (c *Client) ownerOf(ctx context.Context, dataset string, i int) (*Client, string) {
	r := c.route
	r.mu.Lock()
	t, ok := r.tables[dataset]
	r.mu.Unlock()
	if !ok {
		var err error
		if t, err = c.Owners(ctx, dataset); err != nil {
			return nil, ""
		}
		r.mu.Lock()
		r.tables[dataset] = t
		r.mu.Unlock()
	}
	x := -1
	if len(t.Members) > 255 && 2*i+1 < len(t.Owners) && i >= 0 {
		x = int(t.Owners[2*i]) | int(t.Owners[2*i+1])<<8
	} else if len(t.Members) <= 255 && i >= 0 && i < len(t.Owners) {
		x = int(t.Owners[i])
	}
	if x < 0 || x >= len(t.Members) || t.Members[x].HTTP == "" {
		return nil, ""
	}
	addr := t.Members[x].HTTP
	r.mu.Lock()
	defer r.mu.Unlock()
	n, ok := r.nodes[addr]
	if !ok {
		n = &Client{Base: "http://" + addr, Token: c.Token, HTTP: c.HTTP}
		r.nodes[addr] = n
	}
	return n, t.Ring
}

func (c *Client) forgetOwners(dataset string) {
	c.route.mu.Lock()
	delete(c.route.tables, dataset)
	c.route.mu.Unlock()
}

// New returns a client for base with pooled keep-alive connections.
func New(base, token string) *Client {
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxIdleConnsPerHost = 64
	return &Client{Base: strings.TrimSuffix(base, "/"), Token: token, HTTP: &http.Client{Transport: tr, Timeout: 10 * time.Minute}}
}

// Error is a non-2xx answer.
type Error = api.Error

// Do sends a request and returns the response, turning non-2xx into *Error.
func (c *Client) Do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	var encoded []byte
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		encoded = b
	}
	bodyReader := func() io.Reader {
		if encoded == nil {
			return nil
		}
		return bytes.NewReader(encoded)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.Base+path, bodyReader())
	if err != nil {
		return nil, err
	}
	setHeaders(req, body != nil, c.Token)
	resp, err := c.HTTP.Do(req)
	backoff, waited := c.busyBackoff, time.Duration(0)
	if backoff <= 0 {
		backoff = busyBackoff
	}
	for err == nil && resp.StatusCode == http.StatusServiceUnavailable && waited < maxBusyWait {
		after, ok := retryAfter(resp)
		if !ok { // a 503 without Retry-After is not worth waiting for
			break
		}
		// What the node asked for, and never less than a doubling backoff:
		// a node catching up its catalog may take seconds.
		wait := max(after, backoff)
		backoff = min(2*backoff, 4*time.Second)
		waited += wait
		resp.Body.Close()
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(wait):
		}
		if req, err = http.NewRequestWithContext(ctx, method, c.Base+path, bodyReader()); err != nil {
			return nil, err
		}
		setHeaders(req, body != nil, c.Token)
		resp, err = c.HTTP.Do(req)
	}
	if err != nil {
		return nil, c.unreachable(ctx, err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		var e struct {
			Error string `json:"error"`
		}
		msg := strings.TrimSpace(string(b))
		if json.Unmarshal(b, &e) == nil && e.Error != "" {
			msg = e.Error
		}
		return nil, &Error{Status: resp.StatusCode, Message: msg}
	}
	return resp, nil
}

// unreachable says plainly that no node answered (refused, unresolvable,
// timed out) rather than a transport's raw error, as the Python client does;
// the cause stays wrapped. A request the caller cancelled is not that.
func (c *Client) unreachable(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return err
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err // the URL is said once, below
	}
	return fmt.Errorf("no Stallfree node reachable at %s: %w", c.Base, err)
}

// A request told to come back later (503 with Retry-After: the node's
// in-flight bytes are at their bound, its catalog is still catching up
// with the leader's, or a write found no raft leader, or leadership moving,
// and was not applied) is sent again after max(Retry-After, a backoff doubling
// from busyBackoff to 4 s), for at most maxBusyWait in all.
const (
	busyBackoff = 100 * time.Millisecond
	maxBusyWait = 30 * time.Second
)

func setHeaders(req *http.Request, hasBody bool, token string) {
	if hasBody {
		req.Header.Set("Content-Type", "application/json")
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
}

// retryAfter reads a Retry-After of whole seconds (at most 10).
func retryAfter(resp *http.Response) (time.Duration, bool) {
	secs, err := strconv.Atoi(resp.Header.Get("Retry-After"))
	if err != nil || secs < 0 {
		return 0, false
	}
	return time.Duration(min(secs, 10)) * time.Second, true
}

// JSON sends body (if any) and decodes the answer into out (if any).
func (c *Client) JSON(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.Do(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	return json.NewDecoder(resp.Body).Decode(out)
}

// The API's bodies, shared with the server.
type (
	Stats    = api.Stats
	Member   = api.Member
	Cluster  = api.Cluster
	Progress = api.Progress
	// Registration is how far a dataset's registration has got.
	Registration = api.Registration
	Dataset      = api.Dataset
	Job          = api.Job
)

// Item is one fetched item.
type Item struct {
	Key   string `msgpack:"key"`
	Data  []byte `msgpack:"data"`
	Cache string `msgpack:"-"`
	Ring  string `msgpack:"-"` // X-Ring: the ring the answering node routes by
}

func (c *Client) item(ctx context.Context, path string) (Item, error) {
	resp, err := c.Do(ctx, http.MethodGet, path, nil)
	if err != nil {
		return Item{}, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return Item{Key: resp.Header.Get("X-Key"), Data: b, Cache: resp.Header.Get("X-Cache"), Ring: resp.Header.Get("X-Ring")}, err
}

// ItemByKey fetches one item by key.
func (c *Client) ItemByKey(ctx context.Context, dataset, key string) (Item, error) {
	segs := strings.Split(key, "/")
	for i, s := range segs {
		segs[i] = url.PathEscape(s)
	}
	return c.item(ctx, "/v1/datasets/"+url.PathEscape(dataset)+"/items/"+strings.Join(segs, "/"))
}

// ItemByIndex fetches the i-th item of the manifest.
func (c *Client) ItemByIndex(ctx context.Context, dataset string, i int) (Item, error) {
	path := fmt.Sprintf("/v1/datasets/%s/index/%d", url.PathEscape(dataset), i)
	if c.route != nil {
		if owner, ring := c.ownerOf(ctx, dataset, i); owner != nil {
			it, err := owner.item(ctx, path)
			if err == nil {
				if it.Ring != ring {
					c.forgetOwners(dataset) // membership changed: a new table next time
				}
				return it, nil
			}
			if notWritten(err) {
				return Item{}, err // the owner's answer (a derived item), not a routing failure
			}
			c.forgetOwners(dataset)
		}
	}
	return c.item(ctx, path)
}

// ItemByIndexUncached reads the i-th item from storage without touching the
// cache (?cache=bypass).
func (c *Client) ItemByIndexUncached(ctx context.Context, dataset string, i int) (Item, error) {
	return c.item(ctx, fmt.Sprintf("/v1/datasets/%s/index/%d?cache=bypass", url.PathEscape(dataset), i))
}

// Batch fetches several items in order. With RouteByOwner, the batch is
// split by owner and the parts are fetched in parallel, each from its owner;
// any failure falls back to one request to Base.
func (c *Client) Batch(ctx context.Context, dataset string, indices []int) ([]Item, error) {
	if c.route != nil {
		if items, ok := c.batchByOwner(ctx, dataset, indices); ok {
			return items, nil
		}
	}
	items, _, err := c.batch(ctx, dataset, indices)
	return items, err
}

// batch is one /batch request; it also returns the answer's X-Ring.
func (c *Client) batch(ctx context.Context, dataset string, indices []int) ([]Item, string, error) {
	resp, err := c.Do(ctx, http.MethodPost, "/v1/datasets/"+url.PathEscape(dataset)+"/batch", api.BatchRequest{Indices: indices})
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	var items []Item
	if err := msgpack.NewDecoder(resp.Body).Decode(&items); err != nil {
		return nil, "", err
	}
	if len(items) != len(indices) {
		return nil, "", fmt.Errorf("batch of %d indices answered with %d items", len(indices), len(items))
	}
	return items, resp.Header.Get("X-Ring"), nil
}

// batchByOwner fetches each owner's part of a batch from that owner, all
// parts at once; false means some part could not be (ask Base instead).
func (c *Client) batchByOwner(ctx context.Context, dataset string, indices []int) ([]Item, bool) {
	parts := map[*Client][]int{} // positions in indices, by owner
	var ring string
	for j, i := range indices {
		owner, r := c.ownerOf(ctx, dataset, i)
		if owner == nil {
			return nil, false
		}
		ring = r
		parts[owner] = append(parts[owner], j)
	}
	out := make([]Item, len(indices))
	var wg sync.WaitGroup
	var failed, stale atomic.Bool
	for owner, pos := range parts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sub := make([]int, len(pos))
			for x, j := range pos {
				sub[x] = indices[j]
			}
			items, r, err := owner.batch(ctx, dataset, sub)
			if err != nil {
				failed.Store(true)
				return
			}
			stale.CompareAndSwap(false, r != ring)
			for x, j := range pos {
				out[j] = items[x]
			}
		}()
	}
	wg.Wait()
	if failed.Load() || stale.Load() {
		c.forgetOwners(dataset) // membership changed: a new table next time
	}
	return out, !failed.Load()
}

// Sample is one WebDataset sample of a tar dataset: its key (SHARD/SAMPLE)
// and its members' bytes by extension ("jpg", "cls", "seg.png").
type Sample struct {
	Key   string
	Parts map[string][]byte
}

// DecodeMsgpack reads a sample map {"__key__": str, EXT: bin, ...}.
func (s *Sample) DecodeMsgpack(dec *msgpack.Decoder) error {
	n, err := dec.DecodeMapLen()
	if err != nil {
		return err
	}
	s.Parts = make(map[string][]byte, max(n-1, 0))
	for range n {
		k, err := dec.DecodeString()
		if err != nil {
			return err
		}
		if k == "__key__" {
			if s.Key, err = dec.DecodeString(); err != nil {
				return err
			}
			continue
		}
		if s.Parts[k], err = dec.DecodeBytes(); err != nil {
			return err
		}
	}
	return nil
}

// Sample fetches sample i of a tar dataset.
func (c *Client) Sample(ctx context.Context, dataset string, i int) (Sample, error) {
	var s Sample
	err := c.msgpack(ctx, http.MethodGet, fmt.Sprintf("/v1/datasets/%s/samples/%d", url.PathEscape(dataset), i), nil, &s)
	return s, err
}

// Samples fetches several samples of a tar dataset in one request, in order.
func (c *Client) Samples(ctx context.Context, dataset string, indices []int) ([]Sample, error) {
	var out []Sample
	err := c.msgpack(ctx, http.MethodPost, "/v1/datasets/"+url.PathEscape(dataset)+"/samples/batch", api.BatchRequest{Indices: indices}, &out)
	return out, err
}

func (c *Client) msgpack(ctx context.Context, method, path string, body, out any) error {
	resp, err := c.Do(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return msgpack.NewDecoder(resp.Body).Decode(out)
}

// PutDataset registers a dataset (idempotent).
func (c *Client) PutDataset(ctx context.Context, name, source string) (Dataset, error) {
	var d Dataset
	err := c.JSON(ctx, http.MethodPut, "/v1/datasets/"+url.PathEscape(name), api.PutDataset{Source: source}, &d)
	return d, err
}

// RefreshDataset lists a registered dataset's source again as a new version
// (PUT {"refresh": true}); changed is false when the source lists exactly as
// registered and the dataset was left as it was.
func (c *Client) RefreshDataset(ctx context.Context, name string) (d Dataset, changed bool, err error) {
	resp, err := c.Do(ctx, http.MethodPut, "/v1/datasets/"+url.PathEscape(name), api.PutDataset{Refresh: true})
	if err != nil {
		return d, false, err
	}
	defer resp.Body.Close()
	err = json.NewDecoder(resp.Body).Decode(&d)
	return d, resp.StatusCode == http.StatusCreated, err
}

// Dataset describes one dataset.
func (c *Client) Dataset(ctx context.Context, name string) (*Dataset, error) {
	var d Dataset
	if err := c.JSON(ctx, http.MethodGet, "/v1/datasets/"+url.PathEscape(name), nil, &d); err != nil {
		return nil, err
	}
	return &d, nil
}

// Datasets lists datasets.
func (c *Client) Datasets(ctx context.Context) ([]Dataset, error) {
	var out []Dataset
	err := c.JSON(ctx, http.MethodGet, "/v1/datasets", nil, &out)
	return out, err
}

// DeleteDataset removes a dataset.
func (c *Client) DeleteDataset(ctx context.Context, name string) error {
	return c.JSON(ctx, http.MethodDelete, "/v1/datasets/"+url.PathEscape(name), nil, nil)
}

// Stats fetches this node's stats.
func (c *Client) Stats(ctx context.Context) (Stats, error) {
	var s Stats
	err := c.JSON(ctx, http.MethodGet, "/v1/stats", nil, &s)
	return s, err
}

// Cluster fetches the member list.
func (c *Client) Cluster(ctx context.Context) (Cluster, error) {
	var cl Cluster
	err := c.JSON(ctx, http.MethodGet, "/v1/cluster", nil, &cl)
	return cl, err
}

// StartWarmup starts (or joins) a warm-up.
func (c *Client) StartWarmup(ctx context.Context, dataset string) (Progress, error) {
	var p Progress
	err := c.JSON(ctx, http.MethodPost, "/v1/datasets/"+url.PathEscape(dataset)+"/warmup", nil, &p)
	return p, err
}

// Warmup reports warm-up progress.
func (c *Client) Warmup(ctx context.Context, dataset string) (Progress, error) {
	var p Progress
	err := c.JSON(ctx, http.MethodGet, "/v1/datasets/"+url.PathEscape(dataset)+"/warmup", nil, &p)
	return p, err
}

// Registration asks how far the registration of dataset has got (the
// leader answers; 404 before it starts).
func (c *Client) Registration(ctx context.Context, dataset string) (Registration, error) {
	var r Registration
	err := c.JSON(ctx, http.MethodGet, "/v1/datasets/"+url.PathEscape(dataset)+"/registration", nil, &r)
	return r, err
}

// PutJob registers or replaces a job.
func (c *Client) PutJob(ctx context.Context, j Job) (Job, error) {
	var got Job
	err := c.JSON(ctx, http.MethodPut, "/v1/jobs/"+url.PathEscape(j.Name), j, &got)
	return got, err
}

// Job describes one job.
func (c *Client) Job(ctx context.Context, name string) (Job, error) {
	var j Job
	err := c.JSON(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(name), nil, &j)
	return j, err
}

// Jobs lists jobs.
func (c *Client) Jobs(ctx context.Context) ([]Job, error) {
	var out []Job
	err := c.JSON(ctx, http.MethodGet, "/v1/jobs", nil, &out)
	return out, err
}

// DeleteJob removes a job.
func (c *Client) DeleteJob(ctx context.Context, name string) error {
	return c.JSON(ctx, http.MethodDelete, "/v1/jobs/"+url.PathEscape(name), nil, nil)
}

// RankOrderPath is the route of a rank's order for an epoch; its batches
// are below it at /batches/{b}.
func RankOrderPath(job string, epoch, rank int) string {
	return fmt.Sprintf("/v1/jobs/%s/epochs/%d/ranks/%d", url.PathEscape(job), epoch, rank)
}

// RankOrder fetches a rank's locality-aware order for an epoch.
func (c *Client) RankOrder(ctx context.Context, job string, epoch, rank int) (api.RankOrder, error) {
	var o api.RankOrder
	err := c.JSON(ctx, http.MethodGet, RankOrderPath(job, epoch, rank), nil, &o)
	return o, err
}

// ResumedOrder fetches rank's order for the rest of an epoch interrupted
// when every rank of generation from had consumed position samples (from:
// the job's current version, or the one a resize replaced).
func (c *Client) ResumedOrder(ctx context.Context, job string, epoch, rank int, from uint64, position int) (api.RankOrder, error) {
	var o api.RankOrder
	err := c.JSON(ctx, http.MethodGet, fmt.Sprintf("%s?from_generation=%d&position=%d", RankOrderPath(job, epoch, rank), from, position), nil, &o)
	return o, err
}

// ReportPosition tells this node how far a rank of job has got.
func (c *Client) ReportPosition(ctx context.Context, job string, p api.RankPosition) error {
	resp, err := c.Do(ctx, http.MethodPost, fmt.Sprintf("/v1/jobs/%s/ranks/%d/position", url.PathEscape(job), p.Rank), p)
	if err != nil {
		return err
	}
	return resp.Body.Close()
}

// RankPositions lists the rank positions reported to this node for job.
func (c *Client) RankPositions(ctx context.Context, job string) ([]api.RankPosition, error) {
	var out []api.RankPosition
	err := c.JSON(ctx, http.MethodGet, "/v1/jobs/"+url.PathEscape(job)+"/positions", nil, &out)
	return out, err
}

// JobBatch fetches minibatch b of a rank's order.
func (c *Client) JobBatch(ctx context.Context, job string, epoch, rank, b int) ([]Item, error) {
	resp, err := c.Do(ctx, http.MethodGet, fmt.Sprintf("%s/batches/%d", RankOrderPath(job, epoch, rank), b), nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var items []Item
	err = msgpack.NewDecoder(resp.Body).Decode(&items)
	return items, err
}
