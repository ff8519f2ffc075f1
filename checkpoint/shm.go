package checkpoint

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"stallfree/shmdir"
)

// Parts in shared memory (Config.ShmDir, a tmpfs such as /dev/shm): each
// part's mapping is a file there rather than anonymous memory, so a rank
// restoring on this host maps the node's own checked copy read-only
// (GET …?map=1 over the node's Unix socket answers its path) and torch.load
// reads it where it lies: no byte crosses a socket and none is hashed again.
//
// A mapping whose path was handed out is never reused for another part: on
// free its file is removed and unmapped, and its pages go back to the system
// once the last reader unmaps them too. A reader that opens the path after
// the part was dropped finds no file and reads the part over the socket.
// Mappings never handed out are kept as spares as anonymous ones are.

// shmFile is the file behind a mapping.
type shmFile struct {
	path string
	// shared: a reader was given the path; the mapping is not reused.
	shared bool
}

// mapShm maps size bytes backed by a new file in dir. The file's blocks are
// allocated at once (fallocate), so a full tmpfs is an error here rather
// than a SIGBUS on first write.
func mapShm(dir, prefix string, size int64) ([]byte, string, error) {
	f, err := shmdir.Create(dir, prefix)
	if err != nil {
		return nil, "", err
	}
	path := f.Name()
	defer f.Close() // the mapping outlives the descriptor
	if err := syscall.Fallocate(int(f.Fd()), 0, 0, size); err != nil {
		os.Remove(path)
		return nil, "", fmt.Errorf("allocating %d bytes in %s: %w", size, dir, err)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	if err != nil {
		os.Remove(path)
		return nil, "", err
	}
	// Readers open it read-only: this node writes through its own mapping,
	// which keeps the access it was made with.
	if err := f.Chmod(0o400); err != nil {
		syscall.Munmap(b)
		os.Remove(path)
		return nil, "", err
	}
	return b, path, nil
}

// mapKey identifies a mapping by its first byte.
func mapKey(b []byte) *byte { return unsafe.SliceData(b) }

// shmPrefix names this node's part files: stallfree-ckpt-NAME-TAG-, apart
// from the staged batches' stallfree-NAME-TAG-, so neither service's
// clean-up at start removes the other's files.
func shmPrefix(self, tag string) string { return "stallfree-ckpt-" + self + "-" + tag + "-" }
