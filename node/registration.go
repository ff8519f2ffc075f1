package node

import (
	"sync"
	"time"

	"stallfree/api"
	"stallfree/source"
)

// registration is one listing of a dataset's source, watched by
// `cachectl datasets add` while the registration request runs.
type registration struct {
	progress source.Progress
	start    time.Time
	mu       sync.Mutex
	took     time.Duration // set when it ended
	ended    bool
	err      string
}

func (n *Node) startRegistration(name string) *registration {
	r := &registration{start: time.Now()}
	n.mu.Lock()
	n.registrations[name] = r
	n.mu.Unlock()
	return r
}

func (r *registration) end(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ended, r.took = true, time.Since(r.start)
	if err != nil {
		r.err = err.Error()
	}
}

// Registration reports the last listing this node ran for a dataset; false
// when it ran none since it started.
func (n *Node) Registration(name string) (api.Registration, bool) {
	n.mu.Lock()
	r, ok := n.registrations[name]
	n.mu.Unlock()
	if !ok {
		return api.Registration{}, false
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	took := r.took
	if !r.ended {
		took = time.Since(r.start)
	}
	p := &r.progress
	return api.Registration{Running: !r.ended, Listed: p.Listed.Load(), Shards: p.Shards.Load(), ShardsDone: p.ShardsDone.Load(),
		ShardBytes: p.ShardBytes.Load(), Seconds: took.Seconds(), Error: r.err}, true
}
