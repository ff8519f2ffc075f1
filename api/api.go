// Package api holds every body of the public HTTP API (docs/api.md): the
// JSON and msgpack shapes, the headers and the error body, shared by the
// server (node, httpapi), the Go client, cachectl, the loader simulation and
// the tests. Nothing here has behaviour beyond checking a body's own fields.
package api

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// Headers of the API beyond standard HTTP.
const (
	// HeaderCache says where an item came from: hit, peer or miss.
	HeaderCache = "X-Cache"
	// HeaderKey is the item's key on index routes.
	HeaderKey = "X-Key"
	// HeaderForwarded marks a request one node relayed to another (a write
	// to the raft leader, a read a restarted follower cannot answer yet), so
	// it is never relayed again.
	HeaderForwarded = "X-Stallfree-Forwarded"
	// HeaderApplied carries the leader's applied raft index after a catalog
	// write, so the node that relayed it can wait for it (read-your-writes).
	HeaderApplied = "X-Stallfree-Index"
)

// Error is the body of every non-2xx answer, and the Go error a client or a
// relaying node returns for one.
type Error struct {
	Status  int    `json:"-"`
	Message string `json:"error"`
	// Retry marks an answer the client should send again after a moment
	// (Retry-After): a write refused before it reached raft, because no
	// leader is known or leadership is moving, was certainly not applied.
	Retry bool `json:"-"`
}

func (e *Error) Error() string {
	return fmt.Sprintf("HTTP %d %s: %s", e.Status, http.StatusText(e.Status), e.Message)
}

// PutDataset is the body of PUT /v1/datasets/{name}.
type PutDataset struct {
	Source string `json:"source,omitempty"`
	// Quota bounds the bytes of the dataset the cluster caches (each node
	// holds its share by the ring); null lifts it. On an existing dataset
	// the source may be left out; the quota is then all that changes.
	Quota Quota `json:"quota,omitzero"`
	// DerivedFrom and Stage make a derived dataset (a prep cache) instead:
	// the parent's keys and indices, items written by loaders.
	DerivedFrom string `json:"derived_from,omitempty"`
	Stage       string `json:"stage,omitempty"`
	// Refresh lists the registered source again as a new version of the
	// dataset (201 with it; 200 and the registered version when the
	// listing is unchanged). Source may be left out; given, it must be the
	// registered one.
	Refresh bool `json:"refresh,omitempty"`
}

// Quota is PUT /v1/datasets/{name}'s "quota": absent (the zero Quota), a
// number of bytes, or null, which lifts the dataset's quota.
type Quota struct {
	Given bool
	Lift  bool
	Bytes int64
}

// QuotaOf is a quota of n bytes.
func QuotaOf(n int64) Quota { return Quota{Given: true, Bytes: n} }

// NoQuota lifts a quota.
func NoQuota() Quota { return Quota{Given: true, Lift: true} }

// UnmarshalJSON takes a JSON integer or null (JSON's null reaches it, unlike
// a pointer's, so a lift is told from an absent field).
func (q *Quota) UnmarshalJSON(b []byte) error {
	*q = Quota{Given: true}
	if string(b) == "null" {
		q.Lift = true
		return nil
	}
	return json.Unmarshal(b, &q.Bytes)
}

// MarshalJSON writes the number, or null for a lift.
func (q Quota) MarshalJSON() ([]byte, error) {
	if q.Lift {
		return []byte("null"), nil
	}
	return json.Marshal(q.Bytes)
}

// IsZero reports an absent quota (omitzero leaves it out).
func (q Quota) IsZero() bool { return !q.Given }

// BatchRequest is the body of POST /v1/datasets/{name}/batch: exactly one of
// the two lists.
type BatchRequest struct {
	Indices []int    `json:"indices"`
	Keys    []string `json:"keys"`
}

// ItemWrite is one element of the msgpack body of PUT
// /v1/datasets/{name}/batch: an item of a derived dataset, written as by
// PUT /v1/datasets/{name}/index/{i}.
type ItemWrite struct {
	Index int    `msgpack:"index"`
	Data  []byte `msgpack:"data"`
}

// WriteResult is what became of one ItemWrite, in the order written:
// Status is the one PUT /v1/datasets/{name}/index/{i} would have answered
// (201 created, 200 the same bytes again, 409 other bytes were first, 507
// no room, 503 the owner unreachable), Error says why when it is no 2xx.
type WriteResult struct {
	Index   int    `json:"index"`
	Status  int    `json:"status"`
	Bytes   int    `json:"bytes"`
	Created bool   `json:"created"`
	Error   string `json:"error,omitempty"`
}

// BatchItem is one element of a msgpack batch answer (dataset batches and a
// job's minibatches).
type BatchItem struct {
	Key  string `msgpack:"key"`
	Data []byte `msgpack:"data"`
}

// Job is a training job as PUT /v1/jobs/{job} takes it and GET shows it.
type Job struct {
	Name      string   `json:"name,omitempty"`
	Dataset   string   `json:"dataset"`
	Seed      uint64   `json:"seed"`
	WorldSize int      `json:"world_size"`
	BatchSize int      `json:"batch_size"`
	Ranks     []string `json:"ranks"` // the node each rank runs on
	Version   uint64   `json:"version,omitempty"`
	// Previous is the generation this one replaced when only world_size or
	// ranks changed: a sampler state saved under it resumes under this one
	// (the interrupted epoch's remaining samples re-split). Shown, never taken.
	Previous *JobGeneration `json:"previous,omitempty"`
}

// JobInfo is GET /v1/jobs/{job}: the job as registered, and what its ranks'
// stall meters reported over the last 60 s, cluster-wide.
type JobInfo struct {
	Job
	Stall []RankStall `json:"stall"`
}

// RankStall is one rank of a job as its stall meter reported it over the
// last 60 s: the share of the loop's time spent waiting for data, the mean
// step time per batch, samples per second, how long ago it last reported,
// and whether its step time is over 1.2× the median of its job's ranks.
type RankStall struct {
	Rank        int     `json:"rank"`
	Node        string  `json:"node"`
	WaitShare   float64 `json:"wait_share"`
	StepS       float64 `json:"step_s"`
	SamplesPerS float64 `json:"samples_per_s"`
	LastReportS float64 `json:"last_report_s"`
	Straggler   bool    `json:"straggler"`
}

// RankPosition is how far a rank has got, as its sampler last reported at a
// checkpoint: POST /v1/jobs/{job}/ranks/{r}/position takes it (rank from the
// path), GET /v1/jobs/{job}/positions lists what this node was told.
type RankPosition struct {
	Rank       int     `json:"rank"`
	Generation uint64  `json:"generation"`
	Epoch      uint64  `json:"epoch"`
	Position   int     `json:"position"`
	SecondsAgo float64 `json:"seconds_ago"`
}

// JobGeneration is a job's earlier rank layout.
type JobGeneration struct {
	Generation uint64   `json:"generation"`
	WorldSize  int      `json:"world_size"`
	Ranks      []string `json:"ranks"`
}

// Bounds of a job's layout.
const (
	MaxWorldSize = 65536
	MaxBatchSize = 1 << 20
)

// Validate checks the fields a job body must have; whether its dataset
// exists is the catalog's to say.
func (j *Job) Validate() error {
	if j.Dataset == "" {
		return fmt.Errorf("job needs a dataset")
	}
	if j.WorldSize < 1 || j.WorldSize > MaxWorldSize {
		return fmt.Errorf("world_size %d: want 1..%d", j.WorldSize, MaxWorldSize)
	}
	if j.BatchSize < 1 || j.BatchSize > MaxBatchSize {
		return fmt.Errorf("batch_size %d: want 1..%d", j.BatchSize, MaxBatchSize)
	}
	if len(j.Ranks) != 0 && len(j.Ranks) != j.WorldSize {
		return fmt.Errorf("ranks lists %d nodes for world_size %d", len(j.Ranks), j.WorldSize)
	}
	return nil
}

// RankOrder is GET /v1/jobs/{job}/epochs/{e}/ranks/{r}: the rank's
// locality-aware order for the epoch.
type RankOrder struct {
	Indices   []int  `json:"indices"`
	Batches   int    `json:"batches"`
	BatchSize int    `json:"batch_size"`
	Remote    int    `json:"remote"` // samples of this rank that live on another node
	Epoch     uint64 `json:"epoch"`
}

// LoaderWait is the body of POST /v1/loader/wait: what a training loop's
// stall meter measured since its last report.
type LoaderWait struct {
	Seconds float64 `json:"seconds"`
	Batches uint64  `json:"batches"`
	Job     string  `json:"job"`
	Rank    int     `json:"rank"`
	// For the memory split (all optional): the time the loop held its
	// batches (step time), the items in them, the dataset they came from
	// (default: the registered job's), and whether the epoch ended with
	// this report.
	StepSeconds float64 `json:"step_seconds,omitempty"`
	Items       uint64  `json:"items,omitempty"`
	Dataset     string  `json:"dataset,omitempty"`
	EpochEnd    bool    `json:"epoch_end,omitempty"`
}

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
	// Checkpoints in peer memory (checkpoint.go); absent when not served.
	Checkpoints *CheckpointStats `json:"checkpoints,omitempty"`
	// Datasets is what this node's memory holds of each dataset, parent
	// (read from storage) and derived (written by loaders) apart.
	Datasets []DatasetUsage `json:"datasets"`
}

// DatasetUsage is one dataset's share of a node's memory (GET /v1/stats).
type DatasetUsage struct {
	Name string `json:"name"`
	ID   uint32 `json:"id"`
	// DerivedFrom is the parent of a derived dataset ("" for a dataset read
	// from storage).
	DerivedFrom string `json:"derived_from,omitempty"`
	Items       int    `json:"items"`
	Bytes       uint64 `json:"bytes"`
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
	// Socket is the Unix socket path the node serves this API on as well
	// (--socket); set on the answering node's own row only, since a path
	// means something only on that node's host.
	Socket string `json:"socket,omitempty"`
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

// Registration is GET /v1/datasets/{name}/registration: how far the listing
// (for tar sources, the indexing) of a dataset being registered has got.
// The leader, which registers, answers it.
type Registration struct {
	Running    bool    `json:"running"`
	Listed     int64   `json:"listed"`      // objects listed, or tar members indexed
	Shards     int64   `json:"shards"`      // tar shards to index (0: not a tar source, or not listed yet)
	ShardsDone int64   `json:"shards_done"` // tar shards indexed
	ShardBytes int64   `json:"shard_bytes"` // bytes of the shards indexed
	Seconds    float64 `json:"seconds"`
	Error      string  `json:"error,omitempty"`
}

// Dataset is a dataset's catalog entry as the API shows it.
type Dataset struct {
	Name    string `json:"name"`
	Source  string `json:"source"`
	Items   int    `json:"items"`
	Bytes   int64  `json:"bytes"`
	Version uint64 `json:"version"`
	ID      uint32 `json:"id"`
	// Tar datasets only: WebDataset samples, shards, and members the
	// registration left out (not regular files, unsafe or repeated names).
	Samples int `json:"samples,omitempty"`
	Shards  int `json:"shards,omitempty"`
	LeftOut int `json:"left_out,omitempty"`
	// Quota is the dataset's cluster-wide cache quota in bytes, when set.
	Quota *uint64 `json:"quota,omitempty"`
	// Derived datasets only: the parent, the stage, and the items written
	// (held in some member's memory now), counted over every alive member.
	// Bytes is then the bytes written.
	DerivedFrom string `json:"derived_from,omitempty"`
	Stage       string `json:"stage,omitempty"`
	Written     *int   `json:"written,omitempty"`
}

// Owners is GET /v1/datasets/{ds}/owners (msgpack): Owners has one byte per
// index (two, little-endian, when there are more than 255 members), the
// owning member's position in Members. Ring changes when membership does;
// item responses carry it in the X-Ring header.
type Owners struct {
	Ring    string        `msgpack:"ring"`
	Members []OwnerMember `msgpack:"members"`
	Owners  []byte        `msgpack:"owners"`
}

// OwnerMember is a member as an owner table names it.
type OwnerMember struct {
	Name string `msgpack:"name"`
	HTTP string `msgpack:"http"`
}

// PlanJob is one job's row of GET /v1/plan.
type PlanJob struct {
	Job     string `json:"job"`
	Dataset string `json:"dataset"`
	// EpochS is the last complete epoch as measured (wait + step, mean over
	// the ranks); EpochSPredicted is the model's epoch under the plan's split.
	EpochS          float64 `json:"epoch_s"`
	EpochSPredicted float64 `json:"epoch_s_predicted"`
	CachedBytes     uint64  `json:"cached_bytes"`
	KneeBytes       uint64  `json:"knee_bytes"`
	// SecondsSavedPerGiB is how much one more GiB would shorten its epoch at
	// its dataset's current allocation.
	SecondsSavedPerGiB float64 `json:"seconds_saved_per_gib"`
	// Beyond the contract: the model's epoch at the current allocation, the
	// measured epoch's parts, and how many epochs every rank has completed.
	EpochSNow float64 `json:"epoch_s_now"`
	StepS     float64 `json:"step_s"`
	WaitS     float64 `json:"wait_s"`
	MissBytes uint64  `json:"miss_bytes"`
	Ranks     int     `json:"ranks"`
	Epochs    uint64  `json:"epochs"`
}

// PlanDataset is what a plan knew of a dataset.
type PlanDataset struct {
	Dataset          string  `json:"dataset"`
	Bytes            uint64  `json:"bytes"`
	CachedBytes      uint64  `json:"cached_bytes"`
	Quota            *uint64 `json:"quota,omitempty"`
	StorageBytesPerS float64 `json:"storage_bytes_per_s"`
	HitRatio         float64 `json:"hit_ratio"` // MinIO: cached / dataset
}

// Plan is GET /v1/plan (and the answer of POST /v1/plan/apply).
type Plan struct {
	Jobs  []PlanJob         `json:"jobs"`
	Split map[string]uint64 `json:"split"`
	// Beyond the contract: the memory split, the jobs' summed epoch time
	// predicted under the split against the current allocation (0.1: 10%
	// shorter), the datasets' figures, and whether it was applied.
	MemoryBytes     uint64        `json:"memory_bytes"`
	PredictedSaving float64       `json:"predicted_saving"`
	Datasets        []PlanDataset `json:"datasets"`
	Applied         bool          `json:"applied,omitempty"`
}
