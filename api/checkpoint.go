package api

import "encoding/json"

// HeaderChecksum carries a checkpoint part's checksum on PUT and on GET of a
// part: "crc32c:<8 lowercase hex>", "sha256:<64 lowercase hex>" or a bare
// 64-hex sha256 (v3).
const HeaderChecksum = "X-Checksum"

// HeaderCheckpointMap, on the answer to GET …/parts/{part}?map=1 over the
// node's Unix socket, is the path of the file in shared memory holding the
// node's own checked copy of the part (the body is then empty), and
// HeaderCheckpointMapSize its length: the rank maps it read-only. Without
// it the answer is the part's bytes, as for any GET.
const (
	HeaderCheckpointMap     = "X-Checkpoint-Map"
	HeaderCheckpointMapSize = "X-Checkpoint-Map-Size"
	// HeaderCheckpointMapIno and HeaderCheckpointMapDev are the file's inode
	// and device when the node answered: the rank checks the file it opens
	// against them. A part dropped between the answer and the open leaves its
	// name free in a directory others may write (/dev/shm), and a file
	// planted there must not be loaded as the checkpoint.
	HeaderCheckpointMapIno = "X-Checkpoint-Map-Ino"
	HeaderCheckpointMapDev = "X-Checkpoint-Map-Dev"
)

// CommitCheckpoint is the body of POST /v1/checkpoints/{name}/steps/{step}/commit.
type CommitCheckpoint struct {
	Parts []string        `json:"parts"`
	Meta  json.RawMessage `json:"meta,omitempty"`
}

// CheckpointStep is one committed step in GET /v1/checkpoints/{name}.
type CheckpointStep struct {
	Step  uint64   `json:"step"`
	Bytes int64    `json:"bytes"`
	Parts []string `json:"parts"`
	// Replicas is the fewest live copies any of the step's parts has.
	Replicas  int             `json:"replicas"`
	Persisted bool            `json:"persisted"`
	Meta      json.RawMessage `json:"meta,omitempty"`
	// Checksums names each part's checksum algorithm, in Parts' order.
	Checksums []PartChecksum `json:"checksums"`
}

// PartChecksum is a part of a step and the algorithm its checksum uses
// ("crc32c" or "sha256").
type PartChecksum struct {
	Part     string `json:"part"`
	Checksum string `json:"checksum"`
}

// Checkpoint is GET /v1/checkpoints/{name} (and one entry of GET
// /v1/checkpoints). Latest is null before the first commit.
type Checkpoint struct {
	Name   string           `json:"name"`
	Latest *uint64          `json:"latest"`
	Steps  []CheckpointStep `json:"steps"`
}

// CheckpointUpload is GET /v1/checkpoints/{name}/steps/{step}/parts: the
// parts uploaded so far, cluster-wide, with their live copies (a committing
// rank 0 waits on it for the other ranks' parts).
type CheckpointUpload struct {
	Step      uint64         `json:"step"`
	Committed bool           `json:"committed"`
	Parts     []UploadedPart `json:"parts"`
}

// UploadedPart is one part of CheckpointUpload.
type UploadedPart struct {
	Part     string `json:"part"`
	Bytes    int64  `json:"bytes"`
	Replicas int    `json:"replicas"`
	Checksum string `json:"checksum,omitempty"` // "crc32c" or "sha256"
}

// MissingParts is the 409 body of a commit whose parts lack copies.
type MissingParts struct {
	Error   string   `json:"error"`
	Missing []string `json:"missing"`
}

// CheckpointStats is the "checkpoints" object of GET /v1/stats.
type CheckpointStats struct {
	MemoryBytes     uint64 `json:"memory_bytes"`
	UsedBytes       uint64 `json:"used_bytes"`
	Parts           int    `json:"parts"`
	Persist         string `json:"persist,omitempty"`
	PersistedSteps  uint64 `json:"persisted_steps"`
	PersistPending  int    `json:"persist_pending"`
	PersistFailures uint64 `json:"persist_failures"`
	PersistError    string `json:"persist_last_error,omitempty"`
	Rereplicated    uint64 `json:"rereplicated_parts"`
	// DroppedCopies counts copies found to differ from their committed
	// part (and dropped) when read, persisted or copied.
	DroppedCopies uint64 `json:"dropped_copies"`
}
