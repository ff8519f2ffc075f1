// Package shmdir names, creates and cleans up a node's files in its
// shared-memory directory (--shm-dir, a tmpfs such as /dev/shm), where the
// staged batches of coordinated prep and the checkpoint parts live as files
// that processes on the host map. Each kind of file has a prefix naming the
// node (and a digest of its data directory), so a restarted node removes
// what it left behind, and nothing of another node's or another kind's.
package shmdir

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
)

// Create makes a new file in dir, readable and writable by this user only,
// named name followed by random hex (so that a name is never reused while
// a reader may still open the old file).
func Create(dir, name string) (*os.File, error) {
	var r [8]byte
	rand.Read(r[:])
	return os.OpenFile(filepath.Join(dir, name+hex.EncodeToString(r[:])), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
}

// RemoveStale removes the files in dir whose names start with prefix (a
// previous run's, left when it died) and reports how many it removed.
func RemoveStale(dir, prefix string) int {
	old, _ := filepath.Glob(filepath.Join(dir, prefix+"*"))
	n := 0
	for _, p := range old {
		if os.Remove(p) == nil {
			n++
		}
	}
	return n
}
