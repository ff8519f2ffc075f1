package cluster

import (
	"bytes"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/membership"
)

// Describe lists the members this node knows, self first as given, with
// each alive member's cache figures read from its own /metrics.
func (c *Cluster) Describe(self api.Member) []api.Member {
	shares := c.ring().Shares()
	self.Share = shares[c.cfg.Name]
	members := c.ml.Members()
	out := make([]api.Member, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		if m.Name == c.cfg.Name {
			out[i] = self
			continue
		}
		out[i] = api.Member{Name: m.Name, HTTP: m.Meta.HTTP, Peer: m.Meta.Peer, State: string(m.State),
			Capacity: m.Meta.Capacity, Share: shares[m.Name]}
		if m.State != membership.Alive && m.State != membership.Suspect {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.fillRemoteStats(&out[i])
		}()
	}
	wg.Wait()
	return out
}

// fillRemoteStats reads a member's figures from /metrics, which is open
// without a token, so it works even when the API is protected.
func (c *Cluster) fillRemoteStats(m *api.Member) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + m.HTTP + "/metrics")
	if err := c.http.DoTimeout(req, resp, 500*time.Millisecond); err != nil || resp.StatusCode() != 200 {
		return
	}
	m.Items = int(metricValue(resp.Body(), "stallfree_items_cached"))
	m.Bytes = uint64(metricValue(resp.Body(), "stallfree_bytes_cached"))
}

// metricValue reads one unlabelled sample from Prometheus text.
func metricValue(text []byte, name string) float64 {
	for line := range bytes.SplitSeq(text, []byte("\n")) {
		if rest, ok := bytes.CutPrefix(line, []byte(name+" ")); ok {
			v, _ := strconv.ParseFloat(string(bytes.TrimSpace(rest)), 64)
			return v
		}
	}
	return 0
}
