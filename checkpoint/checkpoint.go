// Package checkpoint keeps training checkpoints in the memory of peer nodes
// (docs/api.md, "Checkpoints in peer memory"). A part PUT to a node is
// stored there and, streamed through at the same time, on that node's
// partner: members sorted by name form fixed pairs ((0,1), (2,3), …; an odd
// last node joins the previous pair), independent of the item ring, so two
// copies of a part never sit on one machine and a lost node's partner still
// holds everything it wrote. Commit state goes through the raft catalog;
// bytes never do. Reads and listings use only the local catalog and the
// copies that answer, so they work without a raft quorum. Committed steps
// are written to a persistent store in the background (persist.go), and
// when a member stays dead, the newest steps get their second copy back
// (repair.go).
package checkpoint

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"stallfree/api"
	"stallfree/catalog"
	"stallfree/relay"
	"stallfree/shmdir"
	"stallfree/source"
)

// Errors the API maps to status codes.
var (
	ErrBadRequest     = errors.New("bad request")                   // 400
	ErrLengthRequired = errors.New("Content-Length required")       // 411
	ErrNoRoom         = errors.New("checkpoint memory full")        // 507
	ErrUnavailable    = errors.New("checkpoint copies unavailable") // 503
)

// MissingError is a commit refused because these parts lack two copies (409).
type MissingError struct{ Parts []string }

func (e *MissingError) Error() string {
	return fmt.Sprintf("parts without two copies: %v", e.Parts)
}

// Catalog is what the service needs of the raft catalog.
type Catalog interface {
	Checkpoint(name string) (*catalog.Checkpoint, bool)
	Checkpoints() []*catalog.Checkpoint
	CommitCheckpoint(name string, step uint64, parts []catalog.CheckpointPart, meta string, keep int) (*catalog.CheckpointStep, error)
	MarkCheckpointPersisted(name string, step, version uint64) error
	SetCheckpointHolders(name string, step uint64, parts []catalog.CheckpointPart) error
	DeleteCheckpoint(name string) error
	IsLeader() bool
	Updated() <-chan struct{}
	WaitFor(ctx context.Context, cond func() bool) bool
}

// Members is what the service needs to know about the cluster.
type Members interface {
	// Members are the live members, sorted by name (this node included).
	Members() []string
	// MemberHTTP is a member's HTTP address (this node's included).
	MemberHTTP(name string) (string, bool)
	// LeaderHTTP is the raft leader's HTTP address, "" when unknown.
	LeaderHTTP() string
}

// Config sets up the service; cmd/cachenode fills it from flags.
type Config struct {
	Self string
	// Memory is --checkpoint-memory: the bytes of parts held at once,
	// apart from the item cache.
	Memory uint64
	// Keep is --checkpoint-keep: committed steps kept per name (default 2).
	Keep int
	// Persist is --checkpoint-persist: "", dir:///path or s3://bucket/prefix.
	Persist string
	S3      source.S3Config
	// Relay is the node's client to the other nodes' APIs: parts' copies,
	// reads from peers and commits relayed to the leader go through it.
	Relay *relay.Client
	// DeadGrace is how long a holder stays dead before its parts are copied
	// again (--dead-grace).
	DeadGrace time.Duration
	// Tick paces persistence retries, repair and cleanup (default 1 s).
	Tick time.Duration
	// PeerIdle is how long a part's body read from a peer may make no
	// progress before it is given up (default replicaIdle, 30 s): a frozen
	// peer (SIGSTOP, a paused VM) held a restore, the leader's persisting
	// and a node's shutdown for as long as it stayed frozen.
	PeerIdle time.Duration
	// ShmDir, when set, is a directory in shared memory (--shm-dir, a tmpfs
	// such as /dev/shm) where parts are held as files, which a rank
	// restoring on this host maps instead of reading (shm.go). "":
	// anonymous memory. ShmTag tells this node's files from those of
	// another node of the same name on this host.
	ShmDir, ShmTag string
	Logger         *slog.Logger
}

// Service is safe for concurrent use.
type Service struct {
	cfg     Config
	cat     Catalog
	members Members
	log     *slog.Logger
	mem     *memory
	peers   *relay.Client
	persist backend // nil without --checkpoint-persist

	persisted, persistFailures, repaired atomic.Uint64
	droppedCopies                        atomic.Uint64
	persistPending                       atomic.Int64
	errMu                                sync.Mutex
	persistErr                           string
	steps                                stepClock // when each committed step was first seen (metrics.go)

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// New opens the persistent store (when configured) and starts the
// background work.
func New(cfg Config, cat Catalog, members Members) (*Service, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Keep <= 0 {
		cfg.Keep = 2
	}
	if cfg.Tick <= 0 {
		cfg.Tick = time.Second
	}
	if cfg.PeerIdle <= 0 {
		cfg.PeerIdle = replicaIdle
	}
	if cfg.DeadGrace <= 0 {
		cfg.DeadGrace = time.Minute
	}
	s := &Service{cfg: cfg, cat: cat, members: members, log: cfg.Logger.With("component", "checkpoint"),
		mem: newMemory(cfg.Memory)}
	if cfg.Persist != "" {
		b, err := openBackend(cfg.Persist, cfg.S3)
		if err != nil {
			return nil, fmt.Errorf("--checkpoint-persist: %w", err)
		}
		s.persist = b
	}
	if cfg.ShmDir != "" {
		prefix := shmPrefix(cfg.Self, cfg.ShmTag)
		if n := shmdir.RemoveStale(cfg.ShmDir, prefix); n > 0 {
			s.log.Info("removed checkpoint parts a previous run left in shared memory", "files", n, "dir", cfg.ShmDir)
		}
		var once sync.Once
		s.mem.inShm(cfg.ShmDir, prefix, func(err error) {
			once.Do(func() {
				s.log.Warn("a checkpoint part could not be held in shared memory; such parts are in anonymous memory and read over the socket", "dir", cfg.ShmDir, "err", err)
			})
		})
	}
	s.peers = cfg.Relay
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.wg.Add(2)
	go s.cleanLoop()
	go s.leaderLoop()
	return s, nil
}

// Close stops background work and frees every part.
func (s *Service) Close() {
	s.cancel()
	s.wg.Wait()
	s.mem.dropAll()
}

// Stats is the "checkpoints" object of /v1/stats.
func (s *Service) Stats() api.CheckpointStats {
	used, parts := s.mem.usage()
	st := api.CheckpointStats{MemoryBytes: s.cfg.Memory, UsedBytes: used, Parts: parts,
		PersistedSteps: s.persisted.Load(), PersistFailures: s.persistFailures.Load(),
		PersistPending: int(s.persistPending.Load()), Rereplicated: s.repaired.Load(),
		DroppedCopies: s.droppedCopies.Load()}
	if s.persist != nil {
		st.Persist = s.persist.String()
	}
	s.errMu.Lock()
	st.PersistError = s.persistErr
	s.errMu.Unlock()
	return st
}

// names and parts are path segments everywhere (URLs, persisted keys).
var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// CheckName checks a checkpoint or part name.
func CheckName(what, v string) error {
	if !nameRE.MatchString(v) {
		return fmt.Errorf("%w: %s %q: want 1-128 of A-Z a-z 0-9 . _ - starting with a letter or digit", ErrBadRequest, what, v)
	}
	return nil
}

// Partner is member self's partner among members (sorted by name): fixed
// pairs (0,1), (2,3), …; an odd last node joins the previous pair, whose
// three members then each copy to the next of the three. False when self is
// alone or not a member.
func Partner(members []string, self string) (string, bool) {
	i, ok := slices.BinarySearch(members, self)
	n := len(members)
	if !ok || n < 2 {
		return "", false
	}
	lo := i &^ 1
	if n%2 == 1 && lo >= n-3 { // the last three form one group
		lo = n - 3
		return members[lo+(i-lo+1)%3], true
	}
	return members[lo+(i-lo+1)%2], true
}

// Group is the pair (or triple) member self belongs to.
func Group(members []string, self string) []string {
	i, ok := slices.BinarySearch(members, self)
	n := len(members)
	if !ok || n < 2 {
		return nil
	}
	lo := i &^ 1
	if n%2 == 1 && lo >= n-3 {
		return members[n-3:]
	}
	return members[lo : lo+2]
}

func (s *Service) setPersistErr(msg string) {
	s.errMu.Lock()
	s.persistErr = msg
	s.errMu.Unlock()
}

// live reports the live members as a set.
func (s *Service) live() map[string]bool {
	m := map[string]bool{}
	for _, name := range s.members.Members() {
		m[name] = true
	}
	return m
}

// dropBadCopy drops this node's copy of k, whose bytes (sum) are not the
// committed ones (want): it must never be read, persisted or copied again.
// Reported once: only the caller that drops the copy logs it.
func (s *Service) dropBadCopy(k partKey, sum, want string) {
	if !s.mem.dropIf(k, sum) {
		return
	}
	s.droppedCopies.Add(1)
	s.log.Error("checkpoint copy differs from the committed part; dropped", "name", k.name, "step", k.step, "part", k.part,
		"held_sum", sum, "committed_sum", want)
}
