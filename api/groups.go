package api

import "fmt"

// Bounds of a coordinated-prep group.
const (
	MaxGroupJobs   = 1024
	MaxGroupWindow = 1 << 16
	// DefaultGroupWindow is W when a group's body leaves it out.
	DefaultGroupWindow = 4
)

// HeaderGroupProducer names, on a batch answer of a group, the job index
// that prepares the batch (-1: none, every job is detached).
const HeaderGroupProducer = "X-Group-Producer"

// HeaderGroupMap, on a batch answer to GET …?map=1 over the node's Unix
// socket, is the path of the shared-memory file holding the batch (the body
// is then empty), and HeaderGroupMapSize its length: the job maps it
// read-only.
const (
	HeaderGroupMap     = "X-Group-Map"
	HeaderGroupMapSize = "X-Group-Map-Size"
	// HeaderGroupMapIno is the file's inode when the node answered: the
	// job checks the file it opened against it, since a handed-over batch's
	// path (/proc/PID/fd/N) names whatever the node holds as descriptor N
	// by the time the job opens it.
	HeaderGroupMapIno = "X-Group-Map-Ino"
	// HeaderGroupMapDev is the file's device: an inode number is unique
	// only within one.
	HeaderGroupMapDev = "X-Group-Map-Dev"
)

// HeaderGroupVersion, on a batch answer, is the version of the group's
// definition the batch was staged under: a node keeping a copy of a relayed
// batch for its host keys the copy by it, so a redefined group never
// serves a batch of the definition before.
const HeaderGroupVersion = "X-Group-Version"

// GroupSpec is the body of PUT /v1/groups/{g}.
type GroupSpec struct {
	Dataset   string `json:"dataset"`
	Seed      uint64 `json:"seed"`
	BatchSize int    `json:"batch_size"`
	Jobs      int    `json:"jobs"`
	// Window is W: a job more than W batches behind the fastest is
	// detached. nil: DefaultGroupWindow.
	Window *int `json:"window,omitempty"`
}

// Validate checks the body's own fields and fills the default window.
func (g *GroupSpec) Validate() error {
	if g.Dataset == "" {
		return fmt.Errorf("group needs a dataset")
	}
	if g.BatchSize < 1 || g.BatchSize > MaxBatchSize {
		return fmt.Errorf("batch_size %d: want 1..%d", g.BatchSize, MaxBatchSize)
	}
	if g.Jobs < 1 || g.Jobs > MaxGroupJobs {
		return fmt.Errorf("jobs %d: want 1..%d", g.Jobs, MaxGroupJobs)
	}
	if g.Window == nil {
		w := DefaultGroupWindow
		g.Window = &w
	}
	if *g.Window < 1 || *g.Window > MaxGroupWindow {
		return fmt.Errorf("window %d: want 1..%d", *g.Window, MaxGroupWindow)
	}
	return nil
}

// GroupInfo is GET /v1/groups/{g} (and the answer to its PUT); the fields
// after Jobs extend the contract.
type GroupInfo struct {
	Name      string     `json:"name"`
	Dataset   string     `json:"dataset"`
	Seed      uint64     `json:"seed"`
	BatchSize int        `json:"batch_size"`
	Window    int        `json:"window"`
	Jobs      []GroupJob `json:"jobs"`
	// Samples per epoch and Batches per epoch (the last may be short).
	Samples int    `json:"samples"`
	Batches int    `json:"batches"`
	Version uint64 `json:"version"`
	// StagedBatches and StagedBytes are what the owner holds now; Owner
	// is its name.
	StagedBatches int    `json:"staged_batches"`
	StagedBytes   uint64 `json:"staged_bytes"`
	Owner         string `json:"owner,omitempty"`
	// TimeoutS is the owner's --group-timeout in seconds: a job silent this
	// long (no batch request, no POST .../jobs/{j}/alive) is detached.
	TimeoutS float64 `json:"timeout_s,omitempty"`
}

// GroupJob is one job index of a group, as its owner sees it.
type GroupJob struct {
	Job int `json:"job"`
	// Epoch and Batch are the furthest batch the job asked for or staged.
	Epoch    uint64 `json:"epoch"`
	Batch    int    `json:"batch"`
	Detached bool   `json:"detached"`
	// Prepared counts batches the job staged; Served, batches it read.
	Prepared uint64 `json:"prepared"`
	Served   uint64 `json:"served"`
	// Seen: the job has made a request.
	Seen bool `json:"seen"`
	// From is, for a detached job, the first position (epoch·batches +
	// batch) whose batches the attached jobs prepare instead of it;
	// Why says why it was detached.
	From *uint64 `json:"from,omitempty"`
	Why  string  `json:"why,omitempty"`
}
