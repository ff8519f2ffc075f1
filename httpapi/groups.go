package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"stallfree/api"
	"stallfree/groups"
	"stallfree/handoff"
)

// maxGroupWait bounds ?wait= on group batch routes.
const maxGroupWait = 5 * time.Minute

// EnableGroups serves coordinated prep (/v1/groups) with g; call it before
// Serve.
func (s *Server) EnableGroups(g *groups.Service) {
	s.groups = g
}

// groupBodyLimit is the largest body a /v1/groups route takes: a staged
// batch may be as large as --max-item-bytes.
func (s *Server) groupBodyLimit() int {
	if s.groups == nil {
		return s.srv.MaxRequestBodySize
	}
	return max(s.srv.MaxRequestBodySize, s.groups.MaxBatchBytes())
}

// The /v1/groups routes (lines of the table, routes.go). They answer 404
// while coordinated prep is off (no EnableGroups).

func (s *Server) groupsOff(ctx *fasthttp.RequestCtx) bool {
	if s.groups == nil {
		writeError(ctx, fasthttp.StatusNotFound, "no such route")
		return true
	}
	return false
}

func (s *Server) groupList(ctx *fasthttp.RequestCtx, _ params) {
	if !s.groupsOff(ctx) {
		writeJSON(ctx, 200, s.groups.List())
	}
}

func (s *Server) groupGet(ctx *fasthttp.RequestCtx, p params) {
	if s.groupsOff(ctx) {
		return
	}
	rctx, cancel := reqContext(ctx, 30*time.Second)
	defer cancel()
	info, err := s.groups.Info(rctx, p.get("group"), relayedIndex(ctx))
	if err != nil {
		groupFail(ctx, err)
		return
	}
	writeJSON(ctx, 200, info)
}

func (s *Server) groupPut(ctx *fasthttp.RequestCtx, p params) {
	if s.groupsOff(ctx) {
		return
	}
	var spec api.GroupSpec
	if err := decodeStrict(ctx.PostBody(), &spec); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	if err := validName("dataset", spec.Dataset); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
		return
	}
	rctx, cancel := reqContext(ctx, 30*time.Second)
	defer cancel()
	info, created, err := s.groups.Put(rctx, p.get("group"), spec)
	if err != nil {
		groupFail(ctx, err)
		return
	}
	markApplied(ctx, s.relay)
	writeCreated(ctx, created, info)
}

func (s *Server) groupDelete(ctx *fasthttp.RequestCtx, p params) {
	if s.groupsOff(ctx) {
		return
	}
	rctx, cancel := reqContext(ctx, 30*time.Second)
	defer cancel()
	if err := s.groups.Delete(rctx, p.get("group")); err != nil {
		groupFail(ctx, err)
		return
	}
	markApplied(ctx, s.relay)
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// groupAlive serves POST /v1/groups/{group}/jobs/{job}/alive (a loader's
// liveness, groups.Service.Alive) at the group's owner; any other node
// relays it there. 204, or 410 for a detached job.
func (s *Server) groupAlive(ctx *fasthttp.RequestCtx, p params) {
	if s.groupsOff(ctx) {
		return
	}
	name := p.get("group")
	job, err := strconv.Atoi(p.get("job"))
	if err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("job %q: want the job's index", p.get("job")))
		return
	}
	if addr, self := s.groups.Owner(name); !self && !relayed(ctx) {
		s.relayToOwner(ctx, addr, 0)
		return
	}
	if err := s.groups.Alive(name, job); err != nil {
		groupFail(ctx, err)
		return
	}
	ctx.SetStatusCode(fasthttp.StatusNoContent)
}

// groupBatchRoute serves GET and PUT /v1/groups/{group}/epochs/{epoch}/batches/{batch}.
func (s *Server) groupBatchRoute(ctx *fasthttp.RequestCtx, p params) {
	if !s.groupsOff(ctx) {
		s.groupBatch(ctx, string(ctx.Method()), p.get("group"), p.get("epoch"), p.get("batch"))
	}
}

// groupBatch serves GET and PUT /v1/groups/{g}/epochs/{e}/batches/{b}?job=K
// at the group's owner; any other node relays the request there.
func (s *Server) groupBatch(ctx *fasthttp.RequestCtx, method, name, epochSeg, batchSeg string) {
	if method != fasthttp.MethodGet && method != fasthttp.MethodPut {
		methodNotAllowed(ctx)
		return
	}
	q := ctx.QueryArgs()
	def := time.Duration(0) // a reader asks; a producer waits for room by default
	if method == fasthttp.MethodPut {
		def = 30 * time.Second
	}
	wait, werr := parseWait(string(q.Peek("wait")), def)
	epoch, eerr := strconv.ParseUint(epochSeg, 10, 64)
	b, berr := strconv.Atoi(batchSeg)
	job, jerr := strconv.Atoi(string(q.Peek("job")))
	var version uint64 // ?version=V: a relaying node's host copy is of V (relayRead)
	var verr error
	if v := q.Peek("version"); v != nil {
		version, verr = strconv.ParseUint(string(v), 10, 64)
	}
	if err := errors.Join(werr, eerr, berr, jerr, verr); err != nil {
		writeError(ctx, fasthttp.StatusBadRequest, fmt.Sprintf("epoch %q, batch %q, ?job=K (the job's index), ?wait=DURATION and ?version=V: %v", epochSeg, batchSeg, err))
		return
	}
	if method == fasthttp.MethodGet && wait > 0 {
		// Each waiting read holds a connection (two when relayed) and a
		// goroutine or three for up to its wait: past the node's bound the
		// caller comes back later instead.
		if !s.waiting.TryAcquire(1) {
			writeError(ctx, fasthttp.StatusServiceUnavailable, fmt.Sprintf("%d group reads are waiting on this node already; retry", s.MaxGroupWaits))
			ctx.Response.Header.Set("Retry-After", "1")
			return
		}
		defer s.waiting.Release(1)
	}
	var held *handoff.File
	if method == fasthttp.MethodPut && q.Has("memfd") {
		var err error
		if held, err = s.takeHandedOver(ctx); err != nil {
			writeError(ctx, fasthttp.StatusBadRequest, "?memfd=FD&ino=INODE: "+err.Error())
			return
		}
	}
	if addr, self := s.groups.Owner(name); !self && !relayed(ctx) {
		if method == fasthttp.MethodGet {
			s.relayRead(ctx, addr, wait, name, epoch, b)
			return
		}
		if held != nil {
			// The owner is on another host: the bytes cross to it, once.
			data, err := held.ReadAll()
			held.Close()
			if err != nil {
				writeError(ctx, fasthttp.StatusInternalServerError, err.Error())
				return
			}
			ctx.Request.SetBodyRaw(data)
			ctx.URI().QueryArgs().Del("memfd")
			ctx.URI().QueryArgs().Del("ino")
		}
		s.relayToOwner(ctx, addr, wait)
		return
	}
	rctx, cancel := reqContext(ctx, wait+time.Second)
	defer cancel()
	bt := groups.Batch{Group: name, Job: job, Epoch: epoch, Index: b, After: relayedIndex(ctx), Version: version}
	if method == fasthttp.MethodPut {
		var created bool
		var err error
		if held != nil {
			created, err = s.groups.PutHandedOver(rctx, bt, held, wait)
		} else {
			created, err = s.groups.PutBatch(rctx, bt, ctx.PostBody(), wait)
		}
		if err != nil {
			groupFail(ctx, err)
			return
		}
		writeCreated(ctx, created, map[string]bool{"staged": created})
		return
	}
	staged, producer, err := s.groups.GetStaged(rctx, bt, wait)
	if err != nil {
		groupFail(ctx, err)
		if errors.Is(err, groups.ErrNotStaged) { // after groupFail, which resets the response
			ctx.Response.Header.Set(api.HeaderGroupProducer, strconv.Itoa(producer))
		}
		return
	}
	ctx.Response.Header.Set(api.HeaderGroupProducer, strconv.Itoa(producer))
	ctx.Response.Header.Set(api.HeaderGroupVersion, strconv.FormatUint(staged.Version, 10))
	if string(q.Peek("record")) == "1" && relayed(ctx) {
		// A relaying node holds this batch already (hostcopy.go): the read
		// is counted, the bytes stay here. Only a node's relay is answered
		// so: a client's record=1 gets the bytes like any read.
		ctx.SetStatusCode(fasthttp.StatusOK)
		return
	}
	serveStaged(ctx, staged, string(q.Peek("map")) == "1")
}

// serveStaged answers a staged batch: its bytes, or, to a job on this host
// asking for it (map), the path of the shared-memory file holding them.
func serveStaged(ctx *fasthttp.RequestCtx, staged groups.Staged, mapIt bool) {
	ctx.SetContentType("application/octet-stream")
	switch {
	case staged.Path == "":
		ctx.Response.SetBodyRaw(staged.Data) // staged bytes are never changed, only dropped
	case mapIt && overUnixSocket(ctx):
		// A job on this host maps the batch's file itself: no byte crosses
		// the socket. It opens the file at once (the file outlives the
		// batch by the group service's linger) and checks it is the file
		// named here, whose inode is the one checked now.
		f, err := staged.Open()
		if err != nil {
			stagedGone(ctx, err)
			return
		}
		var st syscall.Stat_t
		err = syscall.Fstat(int(f.Fd()), &st)
		f.Close()
		if err != nil {
			writeError(ctx, fasthttp.StatusInternalServerError, "the staged batch's file: "+err.Error())
			return
		}
		ctx.Response.Header.Set(api.HeaderGroupMap, staged.Path)
		ctx.Response.Header.Set(api.HeaderGroupMapSize, strconv.FormatInt(staged.Size, 10))
		ctx.Response.Header.Set(api.HeaderGroupMapIno, strconv.FormatUint(st.Ino, 10))
		ctx.Response.Header.Set(api.HeaderGroupMapDev, strconv.FormatUint(uint64(st.Dev), 10))
	default:
		f, err := staged.Open()
		if err != nil {
			stagedGone(ctx, err)
			return
		}
		ctx.SetBodyStream(f, int(staged.Size)) // fasthttp closes f
	}
}

// stagedGone answers a staged batch whose file could not be opened: one let
// go since it was looked up (the batch dropped by the other jobs' reads and
// its linger over while this answer waited) is 404 with producer -1, as any
// dropped batch, and the asker makes it itself (its augmentation is seeded,
// so the bytes are the same).
func stagedGone(ctx *fasthttp.RequestCtx, err error) {
	if !errors.Is(err, groups.ErrGone) {
		writeError(ctx, fasthttp.StatusInternalServerError, "opening the staged batch: "+err.Error())
		return
	}
	writeError(ctx, fasthttp.StatusNotFound, err.Error())
	ctx.Response.Header.Set(api.HeaderGroupProducer, "-1")
}

// takeHandedOver takes over the file a producer on this host names in a
// PUT (?memfd=FD&ino=INODE: its descriptor and the file's inode) instead of
// sending the batch's bytes: a memfd it filled, sealed here (package
// handoff). Only over the Unix socket, whose peer is the process whose
// descriptor is opened, and with an empty body.
func (s *Server) takeHandedOver(ctx *fasthttp.RequestCtx) (*handoff.File, error) {
	q := ctx.QueryArgs()
	fd, ferr := strconv.Atoi(string(q.Peek("memfd")))
	ino, ierr := strconv.ParseUint(string(q.Peek("ino")), 10, 64)
	if err := errors.Join(ferr, ierr); err != nil {
		return nil, err
	}
	if !overUnixSocket(ctx) {
		return nil, errors.New("a file is handed over only over the node's Unix socket; send the bytes")
	}
	if len(ctx.Request.Body()) > 0 {
		return nil, errors.New("a handed-over batch has no body")
	}
	pid, err := handoff.PeerPID(ctx.Conn())
	if err != nil {
		return nil, err
	}
	return handoff.Take(pid, fd, ino, int64(s.groupBodyLimit()))
}

// overUnixSocket reports whether the request came over the node's Unix
// socket, from a process on this host.
func overUnixSocket(ctx *fasthttp.RequestCtx) bool {
	_, ok := ctx.LocalAddr().(*net.UnixAddr)
	return ok
}

// relayRead serves a group read on a node that does not own the group:
// from this host's copy of the batch when it has one (the owner only counts
// the read: "record"), else relayed to the owner, keeping the batch it sends
// back for the next jobs on this host. A batch thus crosses to this host
// once, whatever the number of jobs here that read it.
//
// A host copy is of one version of the group's definition, and its record
// read names that version: an owner whose definition is another (the group
// was deleted and defined again, and this node's catalog lags) refuses it
// with 412 before counting anything, and the read is relayed whole instead.
func (s *Server) relayRead(ctx *fasthttp.RequestCtx, addr string, wait time.Duration, group string, epoch uint64, index int) {
	q := ctx.URI().QueryArgs()
	mapIt := string(q.Peek("map")) == "1"
	// The record read and its version are this node's to send: a client's
	// record=1 relayed as it came got an empty answer, kept here as the
	// batch for every job on this host.
	q.Del("record")
	q.Del("version")
	if version, known := s.groups.Version(group); known {
		if local, ok := s.groups.HostCopy(group, version, epoch, index); ok {
			q.Set("record", "1")
			q.Set("version", strconv.FormatUint(version, 10))
			s.relayToOwner(ctx, addr, wait)
			q.Del("record")
			q.Del("version")
			switch ctx.Response.StatusCode() {
			case fasthttp.StatusOK:
				producer := append([]byte(nil), ctx.Response.Header.Peek(api.HeaderGroupProducer)...)
				ctx.Response.Reset()
				ctx.Response.Header.SetBytesV(api.HeaderGroupProducer, producer)
				ctx.Response.Header.Set(api.HeaderGroupVersion, strconv.FormatUint(version, 10))
				serveStaged(ctx, local, mapIt)
				return
			case fasthttp.StatusPreconditionFailed: // the copy is of a definition before: read the batch whole
				ctx.Response.Reset()
			default:
				return
			}
		}
	}
	s.relayToOwner(ctx, addr, wait)
	if ctx.Response.StatusCode() != fasthttp.StatusOK || len(ctx.Response.Header.Peek(api.HeaderGroupMap)) > 0 {
		return
	}
	// An owner from before versioned answers sends no version: its batches
	// are relayed every time, never kept.
	version, err := strconv.ParseUint(string(ctx.Response.Header.Peek(api.HeaderGroupVersion)), 10, 64)
	if err != nil || version == 0 {
		return
	}
	if local, ok := s.groups.KeepHostCopy(group, version, epoch, index, ctx.Response.Body()); ok && mapIt && local.Path != "" && overUnixSocket(ctx) {
		producer := append([]byte(nil), ctx.Response.Header.Peek(api.HeaderGroupProducer)...)
		ctx.Response.Reset()
		ctx.Response.Header.SetBytesV(api.HeaderGroupProducer, producer)
		ctx.Response.Header.Set(api.HeaderGroupVersion, strconv.FormatUint(version, 10))
		serveStaged(ctx, local, true)
	}
}

// relayToOwner hands a batch request to the group's owner and passes its
// answer back.
func (s *Server) relayToOwner(ctx *fasthttp.RequestCtx, addr string, wait time.Duration) {
	// What this node has applied: the owner waits for it before it says a
	// group defined through this node does not exist.
	h := http.Header{api.HeaderApplied: {strconv.FormatUint(s.relay.AppliedIndex(), 10)}}
	rctx, cancel := context.WithTimeout(context.Background(), wait+30*time.Second)
	defer cancel()
	limit := int64(max(MaxBodySize, s.groups.MaxBatchBytes()))
	forward := s.peers.Forward
	if wait > 0 {
		forward = s.peers.ForwardWaiting
	}
	if err := forward(rctx, addr, string(ctx.URI().RequestURI()), &ctx.Request, &ctx.Response, h, limit); err != nil {
		writeError(ctx, fasthttp.StatusServiceUnavailable, fmt.Sprintf("the group's owner at %s: %v", addr, err))
	}
}

// relayedIndex is the raft index a relaying node had applied (0: the request
// was not relayed).
func relayedIndex(ctx *fasthttp.RequestCtx) uint64 {
	if !relayed(ctx) {
		return 0
	}
	idx, _ := strconv.ParseUint(string(ctx.Request.Header.Peek(api.HeaderApplied)), 10, 64)
	return idx
}

// parseWait reads ?wait= as a Go duration ("30s") or seconds ("2.5").
func parseWait(v string, def time.Duration) (time.Duration, error) {
	if v == "" {
		return def, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		f, ferr := strconv.ParseFloat(v, 64)
		if ferr != nil || f != f {
			return 0, fmt.Errorf("wait %q: want a duration such as 30s", v)
		}
		d = time.Duration(f * float64(time.Second))
	}
	if d < 0 || d > maxGroupWait {
		return 0, fmt.Errorf("wait %v: want 0..%v", d, maxGroupWait)
	}
	return d, nil
}

// groupFail maps the groups package's errors to statuses.
func groupFail(ctx *fasthttp.RequestCtx, err error) {
	switch {
	case errors.Is(err, groups.ErrBadRequest):
		writeError(ctx, fasthttp.StatusBadRequest, err.Error())
	case errors.Is(err, groups.ErrDetached):
		writeError(ctx, fasthttp.StatusGone, err.Error())
	case errors.Is(err, groups.ErrNotStaged):
		writeError(ctx, fasthttp.StatusNotFound, err.Error())
	case errors.Is(err, groups.ErrFull):
		writeError(ctx, fasthttp.StatusServiceUnavailable, err.Error())
		ctx.Response.Header.Set("Retry-After", "1")
	case errors.Is(err, groups.ErrTooLarge):
		writeError(ctx, fasthttp.StatusRequestEntityTooLarge, err.Error())
	case errors.Is(err, groups.ErrStale):
		writeError(ctx, fasthttp.StatusPreconditionFailed, err.Error())
	default:
		fail(ctx, err)
	}
}
