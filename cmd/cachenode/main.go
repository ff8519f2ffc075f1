// Command cachenode runs one Stallfree cache node. Every flag can also be set
// as STALLFREE_<FLAG> (dashes become underscores); repeatable flags take a
// comma-separated list there.
package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/http/pprof"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"syscall"
	"time"

	"github.com/dustin/go-humanize"

	"stallfree/catalog"
	"stallfree/control"
	"stallfree/datadir"
	"stallfree/discovery"
	"stallfree/groups"
	"stallfree/httpapi"
	"stallfree/node"
	"stallfree/source"
	"stallfree/split"
)

type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	*l = append(*l, v)
	return nil
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return // the flag package has printed the usage
		}
		fmt.Fprintln(os.Stderr, "cachenode:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	host, _ := os.Hostname()
	fs := flag.NewFlagSet("cachenode", flag.ContinueOnError)
	var (
		name      = fs.String("name", host, "stable node name, unique in the cluster")
		httpAddr  = fs.String("http", "127.0.0.1:7070", "HTTP API listen address")
		peerAddr  = fs.String("peer", "127.0.0.1:7071", "peer transport listen address")
		gossip    = fs.String("gossip", "127.0.0.1:7946", "gossip (memberlist) listen address")
		raftAddr  = fs.String("raft", "127.0.0.1:7072", "raft listen address")
		advertise = fs.String("advertise", "", "IP or host name other nodes use to reach this one (default: the gossip listen host, or this host's name when that is 0.0.0.0)")
		join      = fs.String("join", "", "comma-separated gossip addresses of existing members")
		bootstrap = fs.Bool("bootstrap", false, "form a new raft cluster (first node only)")
		dataDir   = fs.String("data-dir", "", "directory for raft logs and state (default $XDG_STATE_HOME/stallfree/NAME, else ~/.local/state/stallfree/NAME)")
		memory    = fs.String("memory", "4GiB", "cache memory budget (payload plus per-item overhead)")
		policy    = fs.String("policy", "minio", "cache policy: minio, lru or clairvoyant")
		tokenFile = fs.String("token-file", "", "file holding the HTTP bearer token; when set, every /v1 call needs it")
		keyFile   = fs.String("cluster-key-file", "", "file holding the cluster key (gossip encryption, peer authentication)")
		srcRate   = fs.String("source-rate", "0", "throttle each source to this many bytes/s, e.g. 100MB (0 = off; for simulating slow storage)")
		timing    = fs.String("timing", "lan", "timing profile of raft, gossip and rehoming: lan (hosts on one network) or local (nodes on one host: loopback tests and demos)")
		fast      = fs.Bool("fast-timers", false, "the same as --timing local (kept for existing scripts)")
		peerWait  = fs.Duration("peer-timeout", 2*time.Second, "longest wait for a peer before reading storage instead")
		storeWait = fs.Duration("storage-timeout", 30*time.Second, "bound on every storage read (a hung mount answers 504 after it)")
		bodyBytes = fs.String("max-body-bytes", "", "bound on request body bytes being read whole at once, over all connections (derived items, batch writes, staged batches); beyond it 503 with Retry-After before the body is read (default: a quarter of --memory, at least 512MiB)")
		inflight  = fs.String("max-inflight-bytes", "", "bound on response bytes being assembled at once (batches, peer answers); beyond it 503 with Retry-After (default: a quarter of --memory, at least 256MiB)")
		s3Endpt   = fs.String("s3-endpoint", "", "S3-compatible endpoint URL for s3:// datasets, e.g. http://127.0.0.1:9000 (default AWS; path-style addressing when set)")
		s3Region  = fs.String("s3-region", "us-east-1", "S3 region")
		s3Creds   = fs.String("s3-credentials-file", "", "shared AWS credentials file (default: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN from the environment)")
		s3Profile = fs.String("s3-profile", "default", "profile in --s3-credentials-file")
		logLevel  = fs.String("log-level", "info", "debug, info, warn or error")
		pprofAddr = fs.String("pprof", "", "serve net/http/pprof on this address (off when empty)")
		sendBuf   = fs.String("send-buffer", humanize.IBytes(httpapi.DefaultSendBuffer), "kernel send buffer per HTTP connection (0 = autotuning; raise it for links with a bandwidth-delay product over ~1 MiB)")
		datasets  listFlag
		allow     listFlag
	)
	// Memory split by sensitivity (docs/api.md): re-plan the split of cache
	// memory between the reporting jobs' datasets as epochs end.
	autoSplit := fs.Bool("auto-split", false, "re-plan the memory split between jobs every --auto-split-epochs epochs and apply it when it predicts over 5% shorter epochs")
	autoEvery := fs.Uint64("auto-split-epochs", 2, "epochs (of the slowest reporting job) between --auto-split plans")
	// Checkpoints in peer memory (package checkpoint).
	var (
		ckptMemory  = fs.String("checkpoint-memory", "2GiB", "memory for checkpoint parts (their bytes and 1 KiB each for bookkeeping), reserved apart from --memory; a part beyond it is refused (507)")
		ckptKeep    = fs.Int("checkpoint-keep", 2, "committed steps kept per checkpoint name")
		ckptPersist = fs.String("checkpoint-persist", "", "persist committed checkpoint steps in the background to dir:///path or s3://bucket/prefix (S3 as for datasets: --s3-endpoint, credentials)")
		deadGrace   = fs.Duration("dead-grace", 0, "how long a member stays dead before it leaves the raft configuration and its checkpoint parts are copied again (default 1m; 5s with --timing local)")
	)
	// Coordinated prep (groups, docs/api.md).
	groupTimeout := fs.Duration("group-timeout", 30*time.Second, "detach a group's job after this long without a request from it")
	groupLinger := fs.Duration("group-linger", groups.DefaultLinger, "how long a dropped staged batch's file stays in --shm-dir, for a job on this host that was told its path and has not opened it yet")
	shmDir := fs.String("shm-dir", defaultShmDir(), `keep staged batches (coordinated prep) and checkpoint parts as files here (a tmpfs), which jobs on this host map instead of reading them over a socket ("" = in the node's own memory)`)
	shareItems := fs.Bool("share-items", true, "keep the item cache in a memfd that loaders on this host map read-only (DeviceLoader copies a batch's items from it: POST …/batch?map=1 over --socket); false: anonymous memory, items only through the socket")
	idleTimeout := fs.Duration("idle-timeout", httpapi.DefaultIdleTimeout, "cut off a request whose headers or body, or a response whose client takes nothing, make no progress for this long (a body's total time is not bounded)")
	maxItem := fs.String("max-item-bytes", "64MiB", "largest PUT body: a staged group batch, or an item a loader writes to a derived dataset (at most 64MiB there)")
	// Kubernetes (docs/kubernetes.md): a StatefulSet's pods share one spec, so
	// which of them bootstraps is decided from the pod name.
	byOrdinal := fs.Bool("bootstrap-ordinal-zero", false, "StatefulSet rule: bootstrap when --name ends in -0 and the data dir is empty, otherwise join (needs --join; not with --bootstrap)")
	// One log: the node's, raft's and memberlist's lines in one format.
	logFormat := fs.String("log-format", "text", "log line format: text or json (raft's and memberlist's lines too)")
	fs.Var(&datasets, "dataset", "NAME=SOURCE to register at start (repeatable, idempotent)")
	fs.Var(&allow, "allow-source", "only sources under this prefix may be registered (repeatable)")
	// Loader fast path (docs/api.md): the same API on a Unix socket.
	var socket socketFlag
	fs.Var(&socket, "socket", socketUsage)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := applyEnv(fs); err != nil {
		return err
	}

	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		return fmt.Errorf("--log-level: %w", err)
	}
	var handler slog.Handler
	switch opts := (&slog.HandlerOptions{Level: level}); *logFormat {
	case "text":
		handler = slog.NewTextHandler(os.Stderr, opts)
	case "json":
		handler = slog.NewJSONHandler(os.Stderr, opts)
	default:
		return fmt.Errorf("--log-format %q: want text or json", *logFormat)
	}
	log := slog.New(handler).With("node", *name)

	mem, err := parseSize("memory", *memory, minMemory, math.MaxInt64,
		"a size of at least 1MiB, such as 512MiB or 4GiB (IEC units; a plain number counts bytes)")
	if err != nil {
		return err
	}
	// Coordinated prep's flags, checked before anything starts.
	maxItemBytes, err := parseSize("max-item-bytes", *maxItem, 1, 1<<30, "a size up to 1GiB, such as 64MiB")
	if err != nil {
		return err
	}
	if *groupTimeout <= 0 {
		return fmt.Errorf("--group-timeout %v: want a positive duration", *groupTimeout)
	}
	if *idleTimeout <= 0 {
		return fmt.Errorf("--idle-timeout %v: want a positive duration", *idleTimeout)
	}
	sndbuf, err := parseSize("send-buffer", *sendBuf, 0, 1<<30, "a size up to 1GiB, such as 512KiB (0: autotuning)")
	if err != nil {
		return err
	}
	rate, err := parseSize("source-rate", *srcRate, 0, math.MaxInt64, "bytes per second, such as 100MB (0: unthrottled)")
	if err != nil {
		return err
	}
	if *name == "" {
		return errors.New("--name: a node needs a name, unique in the cluster")
	}
	if *s3Creds != "" {
		if _, err := os.Stat(*s3Creds); err != nil {
			return fmt.Errorf("--s3-credentials-file: %w", err)
		}
	}
	if *storeWait <= 0 {
		return fmt.Errorf("--storage-timeout %v: want a positive duration", *storeWait)
	}
	var maxInflight uint64
	if *inflight != "" {
		if maxInflight, err = parseSize("max-inflight-bytes", *inflight, minMemory, math.MaxInt64, "a size of at least 1MiB, such as 512MiB"); err != nil {
			return err
		}
	}
	maxBodyBytes := max(mem/4, httpapi.DefaultMaxBodyBytes)
	if *bodyBytes != "" {
		if maxBodyBytes, err = parseSize("max-body-bytes", *bodyBytes, minMemory, math.MaxInt64, "a size of at least 1MiB, such as 1GiB"); err != nil {
			return err
		}
	}
	if *peerWait <= 0 {
		return fmt.Errorf("--peer-timeout %v: want a positive duration", *peerWait)
	}
	if *fast { // the contract only grows: the old flag names the local profile
		*timing = "local"
	}
	timings, err := node.TimingNamed(*timing)
	if err != nil {
		return fmt.Errorf("--timing: %w", err)
	}
	for _, spec := range datasets {
		if n, src, ok := strings.Cut(spec, "="); !ok || n == "" || src == "" {
			return fmt.Errorf("--dataset %q: want NAME=SOURCE", spec)
		}
	}
	token := ""
	if *tokenFile != "" {
		if token, err = readSecret(*tokenFile); err != nil {
			return fmt.Errorf("--token-file: %w", err)
		}
	}
	var clusterKey []byte
	if *keyFile != "" {
		k, err := readSecret(*keyFile)
		if err != nil {
			return fmt.Errorf("--cluster-key-file: %w", err)
		}
		clusterKey = []byte(k)
	}
	if len(clusterKey) == 0 {
		// Without the key, gossip, peer frames and raft are unauthenticated:
		// anyone who reaches them could join, read items or rewrite the
		// catalog. Loopback only, then.
		for _, b := range []struct{ flag, addr string }{{"gossip", *gossip}, {"peer", *peerAddr}, {"raft", *raftAddr}} {
			if !loopback(b.addr) {
				return fmt.Errorf("--%s %s: binding gossip, peer or raft beyond loopback needs --cluster-key-file "+
					"(without it anyone who reaches the port could join the cluster or rewrite its catalog)", b.flag, b.addr)
			}
		}
	}
	var seeds []string
	for s := range strings.SplitSeq(*join, ",") {
		if s = strings.TrimSpace(s); s != "" {
			seeds = append(seeds, s)
		}
	}
	if *byOrdinal {
		if *bootstrap {
			return errors.New("--bootstrap-ordinal-zero decides whether to bootstrap: give it or --bootstrap, not both")
		}
		if len(seeds) == 0 {
			return errors.New("--bootstrap-ordinal-zero needs --join (the others' address, e.g. the headless Service)")
		}
		first, err := discovery.BootstrapsByOrdinal(*name)
		if err != nil {
			return fmt.Errorf("--bootstrap-ordinal-zero: --name: %w", err)
		}
		// The catalog bootstraps only an empty data dir: with state on disk
		// ordinal 0 comes back as the member it was.
		*bootstrap = first
		log.Info("StatefulSet rule: ordinal 0 bootstraps an empty data dir, the others join", "bootstrap", *bootstrap)
	}
	advIP, err := advertiseIP(*advertise, *gossip)
	if err != nil {
		return err
	}
	if *dataDir == "" {
		*dataDir = defaultDataDir(*name)
	}
	if left, ok := catalog.LeftSeeds(*dataDir); ok && len(seeds) == 0 && len(left) > 0 {
		// This node left its cluster cleanly (SIGTERM) and is no longer in
		// its raft configuration: started again as it was first (the
		// bootstrapping node has no --join), it joins the members it left
		// rather than refuse to start.
		log.Info("this node left its cluster cleanly; joining it again through the members it left", "seeds", left)
		seeds = left
	}
	if !*bootstrap && len(seeds) == 0 {
		// Neither flag: a node on its own. On an empty data dir it forms a
		// one-node cluster (others may --join it later); with state on disk
		// it comes back with the cluster it had. Without this it would wait
		// for a leader that can never be elected.
		log.Info("neither --bootstrap nor --join: forming a one-node cluster (kept on restart)", "data_dir", *dataDir)
		*bootstrap = true
	}
	httpAdv, err := advertised(*httpAddr, advIP)
	if err != nil {
		return fmt.Errorf("--http: %w", err)
	}
	peerAdv, err := advertised(*peerAddr, advIP)
	if err != nil {
		return fmt.Errorf("--peer: %w", err)
	}
	raftAdv, err := advertised(*raftAddr, advIP)
	if err != nil {
		return fmt.Errorf("--raft: %w", err)
	}

	// A --dataset whose source cannot be listed is a bad flag like any
	// other: stop now with the reason, rather than run and never be ready
	// (the registration would fail on the leader, with one line in a log).
	s3cfg := source.S3Config{Endpoint: *s3Endpt, Region: *s3Region, CredentialsFile: *s3Creds, Profile: *s3Profile, Env: os.Getenv}
	for _, spec := range datasets {
		_, src, _ := strings.Cut(spec, "=")
		pctx, cancel := context.WithTimeout(context.Background(), *storeWait)
		err := source.Probe(pctx, src, source.Options{S3: s3cfg})
		cancel()
		if err != nil {
			return fmt.Errorf("--dataset %s: the source cannot be listed: %w", spec, err)
		}
	}

	// One process per data directory: a second node on it would write the
	// same raft log. Released when the process ends, however it ends.
	lock, err := datadir.Acquire(*dataDir)
	if err != nil {
		return err
	}
	defer lock.Close()

	// Loader fast path: bound before the node starts, so GET /v1/cluster
	// names only a socket that exists.
	sockLn, sockPath, err := socketListener(socket, *dataDir, token, log)
	if err != nil {
		return err
	}
	if sockLn != nil {
		defer sockLn.Close() // a node that fails to start leaves no socket behind
	}

	setGC(mem)
	files := raiseFileLimit(log)
	n, err := node.New(node.Config{
		Name: *name, HTTPAdvert: httpAdv, PeerAdvert: peerAdv, RaftBind: *raftAddr, RaftAdvert: raftAdv,
		DataDir: *dataDir, Bootstrap: *bootstrap, Memory: mem, ShareItems: *shareItems, Policy: *policy, AllowSources: allow,
		SourceRate: int64(rate), Timing: timings, Logger: log, Token: token, Datasets: datasets,
		StorageTimeout: *storeWait, MaxInflightBytes: maxInflight, MaxPeerConns: max(64, files/5),
		S3:         source.S3Config{Endpoint: *s3Endpt, Region: *s3Region, CredentialsFile: *s3Creds, Profile: *s3Profile, Env: os.Getenv},
		GossipBind: *gossip, Advertise: advIP, Join: seeds, PeerBind: *peerAddr, ClusterKey: clusterKey, PeerTimeout: *peerWait,
		Socket:    sockPath,
		DeadGrace: *deadGrace,

		MaxItemBytes: int64(maxItemBytes), // prep cache
	})
	if err != nil {
		return err
	}
	defer n.Close()

	if *pprofAddr != "" {
		go func() { log.Warn("pprof", "err", http.ListenAndServe(*pprofAddr, debugMux())) }()
	}
	ln, err := net.Listen("tcp", *httpAddr)
	if err != nil {
		return fmt.Errorf("--http: %w", err)
	}
	srv := httpapi.New(n, token, log)
	srv.SendBuffer = int(sndbuf)
	srv.IdleTimeout = *idleTimeout
	ckpt, err := startCheckpoints(n, *ckptMemory, *ckptKeep, *ckptPersist, *deadGrace, *timing == "local", log,
		source.S3Config{Endpoint: *s3Endpt, Region: *s3Region, CredentialsFile: *s3Creds, Profile: *s3Profile, Env: os.Getenv},
		*shmDir, shmTag(*dataDir))
	if err != nil {
		return err
	}
	defer ckpt.Close()
	srv.SetCheckpoints(ckpt)
	grp := groups.New(n.GroupHost(), groups.Config{Timeout: *groupTimeout, MaxBatchBytes: int(maxItemBytes), Relay: n.Control().Relay(), Logger: log,
		ShmDir: *shmDir, ShmTag: shmTag(*dataDir), Linger: *groupLinger})
	defer grp.Close()
	if err := n.Registry().Register(grp); err != nil { // its host-copy hits on /metrics
		return err
	}
	srv.EnableGroups(grp)
	// Half the descriptors for clients, a fifth for peers: a flood on one
	// port leaves the rest (storage reads, raft, gossip) room to work.
	srv.MaxConns = max(64, files/2)
	srv.MaxBodyBytes = int64(maxBodyBytes)
	serveErr := make(chan error, 2)
	go func() { serveErr <- srv.Serve(ln) }()
	if sockLn != nil { // loader fast path
		go func() { serveErr <- srv.Serve(sockLn) }()
	}
	log.Info("serving", "http", ln.Addr().String(), "socket", sockPath, "memory", humanize.IBytes(mem), "policy", *policy, "data_dir", *dataDir)

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if len(datasets) > 0 {
		// As long as a registration through the API may take; a listing
		// that makes no progress fails sooner (a tar shard's index after 30 s).
		rctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
		err := n.Control().RegisterAtStart(rctx, datasets)
		cancel()
		if errors.Is(err, control.ErrDatasetFlag) {
			return err // the listing failed after the probe passed, say: the reason, exit status 1
		}
		if err != nil {
			log.Error("registering --dataset", "err", err)
		}
	}
	if *autoSplit {
		go split.Auto(ctx, n.Split(), split.AutoConfig{Every: *autoEvery, Log: log})
	}
	select {
	case <-ctx.Done():
	case err := <-serveErr:
		return err
	}
	log.Info("shutting down")
	// A clean stop leaves the cluster first (gossip, then raft's voters), so
	// the nodes that stay keep their quorum: a two-node cluster keeps its
	// leader. A crash skips this, and the others wait out --dead-grace.
	lctx, lcancel := context.WithTimeout(context.Background(), 10*time.Second)
	if err := n.Leave(lctx); err != nil {
		log.Warn("leaving the cluster; the others see a failure instead", "err", err)
	}
	lcancel()
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	open, err := srv.Shutdown(sctx)
	if open > 0 {
		log.Info("requests still open after 10s of draining; their connections close as the node exits", "connections", open)
	}
	return err
}

// setGC tunes the collector for a cache whose items live off-heap (the store's
// arena): the Go heap holds metadata and per-request garbage, so instead of
// collecting whenever the heap doubles (many times a second under load, each
// peer fetch allocating an item's worth), collect when the garbage reaches a
// fixed headroom over what the last collection found live: 128 MiB plus 1/32
// of --memory (4 GiB cached: 1.06x). The live part is mostly manifests (a
// 10 M-item dataset is ~150 MB of them), which a limit of the headroom alone
// would have the collector chase without end; once it is larger than the
// headroom the heap may double, as with GOGC=100, or a registration of 10 M
// files would run dozens of collections over a gigabyte each, and their
// assists stall raft's heartbeats past the leader's lease.
func setGC(memory uint64) {
	debug.SetGCPercent(-1)
	headroom := int64(HeapHeadroom(memory))
	debug.SetMemoryLimit(headroom)
	sample := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	afterEachGC(func() {
		metrics.Read(sample)
		if sample[0].Value.Kind() == metrics.KindUint64 {
			live := int64(sample[0].Value.Uint64())
			debug.SetMemoryLimit(live + max(headroom, live))
		}
	})
}

// afterEachGC calls f after every collection, for the life of the process: a
// fresh object whose cleanup runs once a collection has found it
// unreachable, re-armed each time.
func afterEachGC(f func()) {
	type sentinel struct{ _ [64]byte } // too large for the tiny allocator, which batches objects
	var arm func()
	arm = func() {
		runtime.AddCleanup(new(sentinel), func(struct{}) {
			// Re-armed before f runs: a collection that f's effects let
			// start (or that runs while f does) finds the next sentinel
			// already there, instead of going by without the hook.
			arm()
			f()
		}, struct{}{})
	}
	arm()
}

// debugMux serves net/http/pprof and /debug/free-memory, which collects and
// hands free memory back to the OS at once: what a node holds, measured
// without the garbage its headroom allows (`sfbench -manifest-only`).
func debugMux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	mux.HandleFunc("/debug/free-memory", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "POST only", http.StatusMethodNotAllowed)
			return
		}
		debug.FreeOSMemory()
	})
	return mux
}

// HeapHeadroom is the Go heap a node with this much cache memory may use
// beyond what it holds live.
func HeapHeadroom(memory uint64) uint64 { return 128<<20 + memory/32 }

// applyEnv fills every flag not given on the command line from STALLFREE_<FLAG>.
func applyEnv(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		v, ok := os.LookupEnv("STALLFREE_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_")))
		if !ok {
			return
		}
		vals := []string{v}
		if _, repeatable := f.Value.(*listFlag); repeatable {
			vals = strings.Split(v, ",")
		}
		for _, x := range vals {
			if err := f.Value.Set(x); err != nil {
				errs = append(errs, fmt.Errorf("STALLFREE_%s: %w", strings.ToUpper(f.Name), err))
			}
		}
	})
	return errors.Join(errs...)
}

// parseSize reads a size flag ("4GiB", "512 KiB", "100MB") that must lie in
// [min, max]; want says so in the error.
// loopback reports whether a listen address binds only loopback.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// raiseFileLimit lifts the soft RLIMIT_NOFILE to the hard limit and returns
// the limit in force.
func raiseFileLimit(log *slog.Logger) int {
	var r syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &r); err != nil {
		return 1024
	}
	if r.Cur < r.Max {
		want := r
		want.Cur = r.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err == nil {
			r = want
		}
	}
	log.Debug("file descriptors", "limit", r.Cur)
	return int(min(r.Cur, 1<<30))
}

// minMemory refuses budgets that cannot hold a dataset worth caching, such
// as "--memory 10" meant as 10 GiB.
const minMemory = 1 << 20

func parseSize(flagName, value string, min, max uint64, want string) (uint64, error) {
	n, err := humanize.ParseBytes(value)
	if err != nil || n < min || n > max {
		return 0, fmt.Errorf("--%s %q: want %s", flagName, value, want)
	}
	return n, nil
}

func readSecret(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return s, nil
}

// advertiseIP turns --advertise into the IP other nodes dial. A host name is
// resolved once at start (in a container, its own name gives its address);
// without --advertise the gossip listen host is used, and when that is
// 0.0.0.0 the node's own host name is resolved.
func advertiseIP(advertise, gossip string) (string, error) {
	host := advertise
	if host == "" {
		h, _, err := net.SplitHostPort(gossip)
		if err != nil {
			return "", fmt.Errorf("--gossip: %w", err)
		}
		host = h
		if ip := net.ParseIP(h); ip != nil && ip.IsUnspecified() {
			if host, err = os.Hostname(); err != nil {
				return "", fmt.Errorf("--advertise: %w", err)
			}
		}
	}
	if ip := net.ParseIP(host); ip != nil {
		return host, nil
	}
	ips, err := net.LookupIP(host)
	if err != nil {
		return "", fmt.Errorf("--advertise %q: %w", host, err)
	}
	for _, ip := range ips {
		if ip4 := ip.To4(); ip4 != nil && !ip4.IsLoopback() {
			return ip4.String(), nil
		}
	}
	for _, ip := range ips {
		if ip.To4() != nil {
			return ip.String(), nil
		}
	}
	return "", fmt.Errorf("--advertise %q resolves to no IPv4 address", host)
}

// advertised is the address other nodes should dial for a listen address.
func advertised(listen, advertise string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", err
	}
	if advertise != "" {
		host = advertise
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		return "", fmt.Errorf("listening on %q needs --advertise", listen)
	}
	return net.JoinHostPort(host, port), nil
}

// defaultDataDir keeps state out of the working directory: a node started
// from a checkout must not write its raft store into it (nor resume one that
// was committed there by mistake).
func defaultDataDir(name string) string {
	if d := os.Getenv("XDG_STATE_HOME"); d != "" {
		return filepath.Join(d, "stallfree", name)
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "stallfree", name)
	}
	return filepath.Join(os.TempDir(), "stallfree", name)
}

// defaultShmDir is /dev/shm where this host has a writable one (Linux): a
// staged batch kept there is mapped by the jobs on this host.
func defaultShmDir() string {
	const dir = "/dev/shm"
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || syscall.Access(dir, 2 /* W_OK */) != nil {
		return ""
	}
	return dir
}

// shmTag tells this node's shared-memory files from those of another node
// with the same name on this host (tests start many "n1"s): a digest of its
// data directory, which one live node holds at a time.
func shmTag(dataDir string) string {
	abs, err := filepath.Abs(dataDir)
	if err != nil {
		abs = dataDir
	}
	sum := sha256.Sum256([]byte(abs))
	return hex.EncodeToString(sum[:4])
}
