// Package api holds the JSON bodies of the public HTTP API (DESIGN §4),
// shared by the server (node, httpapi) and the Go client.
package api

// Stats is GET /v1/stats; the fields after Policy extend the contract.
type Stats struct {
	Name          string `json:"name"`
	ItemsCached   int    `json:"items_cached"`
	BytesCached   uint64 `json:"bytes_cached"`
	CapacityBytes uint64 `json:"capacity_bytes"`
	HitsLocal     uint64 `json:"hits_local"`
	HitsPeer      uint64 `json:"hits_peer"`
	Misses        uint64 `json:"misses"`
	SourceReads   uint64 `json:"source_reads"`
	SourceBytes   uint64 `json:"source_bytes"`
	PeerBytesIn   uint64 `json:"peer_bytes_in"`
	PeerBytesOut  uint64 `json:"peer_bytes_out"`
	Policy        string `json:"policy"`
	UsedBytes     uint64 `json:"used_bytes"`
	Evictions     uint64 `json:"evictions"`
	BytesServed   uint64 `json:"bytes_served"`
	PeerFailures  uint64 `json:"peer_failures"`
	// What training loops reported through the stall meter.
	LoaderWaitSeconds float64 `json:"loader_wait_seconds"`
	LoaderBatches     uint64  `json:"loader_batches"`
}

// Member is one row of GET /v1/cluster.
type Member struct {
	Name     string  `json:"name"`
	HTTP     string  `json:"http"`
	Peer     string  `json:"peer"`
	State    string  `json:"state"` // alive, suspect, dead or left
	Items    int     `json:"items"`
	Bytes    uint64  `json:"bytes"`
	Capacity uint64  `json:"capacity"`
	Share    float64 `json:"share"`          // fraction of the ring this member owns
	Raft     string  `json:"raft,omitempty"` // voter or nonvoter in the catalog's raft configuration
}

// Cluster is GET /v1/cluster.
type Cluster struct {
	Self    string   `json:"self"`
	Leader  string   `json:"leader"`
	Members []Member `json:"members"`
}

// Progress is GET /v1/datasets/{name}/warmup.
type Progress struct {
	Done    int64  `json:"done"`
	Total   int64  `json:"total"`
	Bytes   int64  `json:"bytes"`
	Running bool   `json:"running"`
	Full    bool   `json:"full"` // stopped early: the store admits nothing more
	Error   string `json:"error,omitempty"`
}

// Dataset is a dataset's catalog entry as the API shows it.
type Dataset struct {
	Name    string `json:"name"`
	Source  string `json:"source"`
	Items   int    `json:"items"`
	Bytes   int64  `json:"bytes"`
	Version uint64 `json:"version"`
	ID      uint32 `json:"id"`
}
