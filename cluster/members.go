package cluster

import (
	"context"
	"sync"
	"time"

	"stallfree/api"
	"stallfree/membership"
	"stallfree/transport"
)

// Describe lists the members this node knows, self first as given, with
// each alive member's cache figures, asked of it over the peer transport.
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

// fillRemoteStats asks a member for its figures (transport.OpStats); a
// member that does not answer in time is shown without them.
func (c *Cluster) fillRemoteStats(m *api.Member) {
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	f, err := c.client.Figures(ctx, m.Peer)
	if err != nil {
		c.log.Debug("a member's figures", "member", m.Name, "err", err)
		return
	}
	m.Items, m.Bytes = f.Items, f.Bytes
}

// figures are this member's, as others ask for them.
func (c *Cluster) figures() transport.Figures {
	st := c.store.Stats()
	return transport.Figures{Items: st.Items, Bytes: st.Bytes}
}
