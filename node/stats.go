package node

import (
	"regexp"
	"sync/atomic"

	"stallfree/api"
	"stallfree/cluster"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// counters are the node's cumulative figures. /v1/stats and /metrics read the
// same atomics, so the two can never disagree.
type counters struct {
	hitsLocal     atomic.Uint64
	hitsPeer      atomic.Uint64
	misses        atomic.Uint64
	sourceReads   atomic.Uint64
	sourceBytes   atomic.Uint64
	bytesServed   atomic.Uint64
	loaderWaitNs  atomic.Uint64
	loaderBatches atomic.Uint64
	relayedReads  atomic.Uint64
}

// Stats returns this node's figures.
func (n *Node) Stats() api.Stats {
	st := n.store.Stats()
	ps := n.peers.Stats()
	c := &n.counters
	return api.Stats{
		Name: n.cfg.Name, ItemsCached: st.Items, BytesCached: st.Bytes, CapacityBytes: st.Capacity,
		HitsLocal: c.hitsLocal.Load(), HitsPeer: c.hitsPeer.Load(), Misses: c.misses.Load(),
		SourceReads: c.sourceReads.Load(), SourceBytes: c.sourceBytes.Load(),
		PeerBytesIn: ps.PeerBytesIn, PeerBytesOut: ps.PeerBytesOut,
		Policy: st.Policy, UsedBytes: st.Used, Evictions: st.Evicted, BytesServed: c.bytesServed.Load(),
		PeerFailures: ps.PeerFailures, LoaderWaitSeconds: float64(c.loaderWaitNs.Load()) / 1e9,
		LoaderBatches: c.loaderBatches.Load(), Datasets: n.prep.Usage(),
	}
}

func (n *Node) registerMetrics() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	// The GC pause histogram (go_sched_pauses_total_gc_seconds) gives pause
	// percentiles; the default summary only has quartiles and the maximum.
	pauses := collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/sched/pauses/total/gc:seconds$`)}
	reg.MustRegister(collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(pauses)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	counter := func(name, help string, v *atomic.Uint64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "stallfree_" + name, Help: help},
			func() float64 { return float64(v.Load()) }))
	}
	c := &n.counters
	counter("hits_local_total", "Requests served from this node's memory.", &c.hitsLocal)
	counter("hits_peer_total", "Requests served from a peer's memory.", &c.hitsPeer)
	counter("misses_total", "Requests that needed a storage read.", &c.misses)
	counter("source_reads_total", "Reads from backing storage.", &c.sourceReads)
	counter("source_bytes_total", "Bytes read from backing storage.", &c.sourceBytes)
	peerCounter := func(name, help string, f func(cluster.Stats) uint64) {
		reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "stallfree_" + name, Help: help},
			func() float64 { return float64(f(n.peers.Stats())) }))
	}
	peerCounter("peer_bytes_in_total", "Item bytes received from peers.", func(s cluster.Stats) uint64 { return s.PeerBytesIn })
	peerCounter("peer_bytes_out_total", "Item bytes sent to peers.", func(s cluster.Stats) uint64 { return s.PeerBytesOut })
	counter("served_bytes_total", "Item bytes sent to HTTP clients.", &c.bytesServed)
	peerCounter("peer_failures_total", "Peer fetches that failed and fell back to storage.", func(s cluster.Stats) uint64 { return s.PeerFailures })
	peerCounter("ring_changes_total", "Rings rebuilt on membership changes since the node started.", func(s cluster.Stats) uint64 { return s.RingChanges })
	peerCounter("members_vouched_total", "Members gossip declared dead that answered this node directly and stayed on its ring.", func(s cluster.Stats) uint64 { return s.MembersVouched })
	reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "stallfree_loader_wait_seconds_total",
		Help: "Total time training loops reported waiting for data."},
		func() float64 { return float64(c.loaderWaitNs.Load()) / 1e9 }))
	counter("relayed_reads_total", "Reads this follower's catalog could not answer yet, answered by the raft leader.", &c.relayedReads)
	counter("loader_batches_total", "Batches training loops reported through the stall meter.", &c.loaderBatches)
	gauge := func(name, help string, f func(api.Stats) float64) {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "stallfree_" + name, Help: help},
			func() float64 { return f(n.Stats()) }))
	}
	gauge("items_cached", "Items resident in this node's store.", func(s api.Stats) float64 { return float64(s.ItemsCached) })
	gauge("bytes_cached", "Payload bytes resident in this node's store.", func(s api.Stats) float64 { return float64(s.BytesCached) })
	gauge("used_bytes", "Bytes charged against the memory budget (payload + per-item overhead).", func(s api.Stats) float64 { return float64(s.UsedBytes) })
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "stallfree_catalog_applied_index",
		Help: "The raft index this node's catalog has applied (every catalog write moves it)."},
		func() float64 { return float64(n.cat.AppliedIndex()) }))
	gauge("capacity_bytes", "The store's memory budget.", func(s api.Stats) float64 { return float64(s.CapacityBytes) })
	reg.MustRegister(newRankCollector(n.Split()), newOpsCollector(n))
	return reg
}
