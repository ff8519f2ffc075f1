"""Checkpoints in peer memory (docs/api.md).

``Checkpointer(url, name, rank=0)`` snapshots a training state into memory
(``torch.save`` into a buffer: the only time the training loop waits) and
uploads it in the background to the local cache node, which keeps it in its
own memory and its partner's; rank 0 then commits the step. A restarted job
``load()``s the newest committed step from whichever copy survives.

The split between a snapshot the loop waits for and a persist it does not is
CheckFreq's (Mohan et al., FAST '21); keeping the copies in peer memory is
Gemini's (Wang et al., SOSP '23).
"""

import bisect
import concurrent.futures
import hashlib
import http.client
import io
import math
import re
import threading
import time
import urllib.parse
import warnings

from ._mapped import map_readonly
from .client import Client, StallfreeError, _socket_path, _UnixHTTPConnection

#: A rank's state is cut into parts of at most this many bytes.
PART_BYTES = 64 << 20

#: CheckFreq's bound on checkpoint overhead, as a fraction of training time.
MAX_OVERHEAD = 0.035


def _torch():
    import torch  # imported on use: the rest of stallfree works without torch

    return torch


def part_names(rank, count):
    """The names of a rank's parts: ``"R"`` for one part, ``"R.I-of-N"`` when
    the state was split (so the committing rank can tell when all are in)."""
    if count == 1:
        return [str(rank)]
    return [f"{rank}.{i}-of-{count}" for i in range(count)]


_PART = re.compile(r"^(\d+)(?:\.(\d+)-of-(\d+))?$")


def _parse_part(name):
    m = _PART.match(name)
    if not m:
        return None
    rank = int(m.group(1))
    if m.group(2) is None:
        return rank, 0, 1
    return rank, int(m.group(2)), int(m.group(3))


def _crc32c():
    """Debian's python3-crc32c (``crc32c.crc32c(data, value)``), or None."""
    try:
        import crc32c
    except ImportError:
        return None
    return crc32c


def _fast_crc32c():
    """The crc32c module when it uses the CPU's CRC instruction, or None.
    A software crc32c (Debian's python3-crc32c 2.3 is built without SSE4.2)
    sums at about sha256's speed and holds the GIL for the whole sum, so
    summing a part in save()'s background thread stops the training loop's
    thread that long, where hashlib's sha256 lets it run. Parts summed with
    crc32c are still checked with it (_Summer.for_header)."""
    crc = _crc32c()
    return crc if crc is not None and getattr(crc, "hardware_based", False) else None


class _Summer:
    """An incremental checksum of one algorithm; ``header()`` is its
    X-Checksum value (``crc32c:<8 hex>`` or a bare 64-hex sha256, the form
    the node keeps)."""

    def __init__(self, algo):
        self.algo = algo
        if algo == "crc32c":
            self._crc, self._value = _crc32c(), 0
        else:
            self._h = hashlib.sha256()

    @classmethod
    def for_header(cls, header):
        """The summer a node's X-Checksum answer was made with."""
        algo = "crc32c" if (header or "").startswith("crc32c:") else "sha256"
        if algo == "crc32c" and _crc32c() is None:
            return None  # cannot check here; the node checked it
        return cls(algo)

    def update(self, data):
        if self.algo == "crc32c":
            self._value = self._crc.crc32c(data, self._value)
        else:
            self._h.update(data)

    def header(self):
        if self.algo == "crc32c":
            return f"crc32c:{self._value:08x}"
        return self._h.hexdigest()


def _same_sum(got, want):
    """Whether a part's X-Checksum (either spelling of a sha256) matches."""
    strip = lambda v: v[len("sha256:"):] if v and v.startswith("sha256:") else v
    return strip(got) == strip(want)


_warned_no_crc32c = []


def _checksum_algo(requested):
    if requested not in ("crc32c", "sha256"):
        raise ValueError(f"checksum={requested!r}: want 'crc32c' or 'sha256'")
    if requested == "crc32c" and _fast_crc32c() is None:
        if not _warned_no_crc32c:
            _warned_no_crc32c.append(True)
            why = ("no crc32c module (Debian: python3-crc32c)" if _crc32c() is None else
                   "the crc32c module here is not hardware-based (it would hold the GIL while it sums)")
            warnings.warn(f"stallfree.checkpoint: {why}; checkpoint parts are checked with sha256 instead",
                          RuntimeWarning, stacklevel=3)
        return "sha256"
    return requested


class _ViewFile(io.RawIOBase):
    """A read-only, seekable file over a buffer, without copying it."""

    def __init__(self, view):
        super().__init__()
        self._view, self._pos = view, 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def readinto(self, b):
        n = max(0, min(len(b), len(self._view) - self._pos))
        b[:n] = self._view[self._pos:self._pos + n]
        self._pos += n
        return n

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def tell(self):
        return self._pos


class _ChainFile(_ViewFile):
    """A read-only, seekable file over several buffers one after the other
    (a rank's parts, each mapped where the node holds it), without joining
    them."""

    def __init__(self, views):
        super().__init__(b"")
        self._views = [v for v in views if len(v)]
        self._starts, total = [], 0
        for v in self._views:
            self._starts.append(total)
            total += len(v)
        self._size = total

    def readinto(self, b):
        want = max(0, min(len(b), self._size - self._pos))
        done = 0
        while done < want:
            i = bisect.bisect_right(self._starts, self._pos) - 1
            v, off = self._views[i], self._pos - self._starts[i]
            n = min(want - done, len(v) - off)
            b[done:done + n] = v[off:off + n]
            done += n
            self._pos += n
        return done

    def seek(self, offset, whence=io.SEEK_SET):
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos


def _map_readonly(path, size, ident=None):
    """A part's file in the node's shared memory, mapped read-only; None when
    it is gone (dropped since), not the size the node said, or not the file
    it named (ident: device and inode; another's file put under the name of
    a part dropped since the node answered, which torch.load would unpickle)."""
    if size == 0:
        return None
    try:
        return map_readonly(path, size, ident)
    except (OSError, ValueError):
        return None


class Checkpointer:
    """Saves and loads one job's checkpoints in the cluster's memory.

    ``url`` is the local node, ``name`` the checkpoint (one per job), ``rank``
    this process's rank. ``world_size`` defaults to torch.distributed's when
    it is initialised, else 1: every rank saves its own part, rank 0 commits
    once all ranks' parts have their two copies. ``part_bytes`` is where a
    rank's state is split (64 MiB). ``checksum`` is the algorithm parts are
    checked with end to end: ``"crc32c"`` (the default; sha256 where the
    crc32c module is missing, said once) or ``"sha256"``.
    """

    def __init__(self, url, name, rank=0, world_size=None, token=None, part_bytes=PART_BYTES,
                 timeout=600.0, parallel=2, checksum="crc32c"):
        if world_size is None:
            world_size = 1
            try:
                dist = _torch().distributed
                if dist.is_available() and dist.is_initialized():
                    world_size = dist.get_world_size()
            except ImportError:
                pass
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.url, self.name, self.rank, self.world_size = url, name, rank, world_size
        self.token, self.timeout = token, timeout
        self.part_bytes = int(part_bytes)
        self.parallel = max(1, int(parallel))
        #: The checksum algorithm this checkpointer's parts use.
        self.checksum = _checksum_algo(checksum)
        self._client = Client(url, token=token, timeout=timeout)
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="stallfree-ckpt")
        self._inflight = None
        self._lock = threading.Lock()
        #: Seconds the last save() held the training loop (the snapshot).
        self.snapshot_seconds = None
        #: Seconds the last save took in the background (upload and commit).
        self.upload_seconds = None
        #: Bytes of the last snapshot.
        self.snapshot_bytes = None
        #: The interval auto() chose, in steps.
        self.interval = None

    # -- saving --------------------------------------------------------------

    def save(self, step, state, meta=None):
        """Snapshots ``state`` now and uploads it in the background.

        The loop waits only for ``torch.save`` into memory (and for the
        previous save's upload, if it is still running: one save in flight at
        a time). Returns a ``concurrent.futures.Future`` that resolves to the
        committed step's listing once the step is committed cluster-wide.
        """
        step = int(step)
        with self._lock:
            prev = self._inflight
        if prev is not None:
            concurrent.futures.wait([prev])  # its outcome is on its own future
        t0 = time.perf_counter()
        buf = io.BytesIO()
        _torch().save(state, buf)
        data = buf.getbuffer()  # no copy: the buffer is ours alone now
        self.snapshot_seconds = time.perf_counter() - t0
        self.snapshot_bytes = len(data)
        fut = self._executor.submit(self._upload, step, data, meta)
        with self._lock:
            self._inflight = fut
        return fut

    def _upload(self, step, data, meta):
        t0 = time.perf_counter()
        try:
            count = max(1, math.ceil(len(data) / self.part_bytes))
            names = part_names(self.rank, count)
            jobs = []
            for i, part in enumerate(names):
                jobs.append((part, data[i * self.part_bytes:(i + 1) * self.part_bytes]))
            if self.parallel > 1 and len(jobs) > 1:
                with concurrent.futures.ThreadPoolExecutor(max_workers=self.parallel) as ex:
                    for f in [ex.submit(self._put, step, part, chunk) for part, chunk in jobs]:
                        f.result()
            else:
                for part, chunk in jobs:
                    self._put(step, part, chunk)
            if self.rank == 0:
                parts = names if self.world_size == 1 else self._await_ranks(step)
                result = self._client.json("POST", self._path(f"/steps/{step}/commit"),
                                           {"parts": parts, "meta": meta if meta is not None else {}})
            else:
                result = self._await_commit(step)
            return result
        finally:
            self.upload_seconds = time.perf_counter() - t0

    def _put(self, step, part, chunk):
        summer = _Summer(self.checksum)
        summer.update(chunk)
        sum_ = summer.header()
        # http.client sends a memoryview as it is: the part is not copied.
        self._client.request("PUT", self._path(f"/steps/{step}/parts/{part}"), body=chunk,
                             headers={"X-Checksum": sum_, "Content-Type": "application/octet-stream"})

    def _await_ranks(self, step):
        """Rank 0: waits until every rank's parts are all uploaded with two
        copies, and returns their names."""
        deadline = time.monotonic() + self.timeout
        while True:
            up = self._client.json("GET", self._path(f"/steps/{step}/parts"))
            have = {}
            for p in up.get("parts", []):
                parsed = _parse_part(p["part"])
                if parsed is None or p.get("replicas", 0) < 2:
                    continue
                rank, i, n = parsed
                have.setdefault(rank, {})[i] = (n, p["part"])
            names, complete = [], True
            for r in range(self.world_size):
                got = have.get(r, {})
                counts = {n for n, _ in got.values()}
                if len(counts) != 1 or len(got) != next(iter(counts)):
                    complete = False
                    break
                names += [got[i][1] for i in sorted(got)]
            if complete:
                return names
            if time.monotonic() > deadline:
                raise TimeoutError(f"checkpoint {self.name} step {step}: not every rank's parts arrived")
            time.sleep(0.05)

    def _await_commit(self, step):
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                info = self._client.json("GET", self._path(""))
                for s in info.get("steps", []):
                    if s["step"] == step:
                        return s
                if info.get("latest") is not None and info["latest"] > step:
                    raise RuntimeError(f"checkpoint {self.name}: step {step} was superseded before it committed")
            except StallfreeError as e:
                if e.status != 404:
                    raise
            if time.monotonic() > deadline:
                raise TimeoutError(f"checkpoint {self.name} step {step}: rank 0 did not commit")
            time.sleep(0.05)

    def wait(self):
        """Waits for the save in flight (if any) and returns its result."""
        with self._lock:
            fut = self._inflight
        return fut.result() if fut is not None else None

    # -- loading -------------------------------------------------------------

    def steps(self):
        """The committed steps' listings, oldest first ([] when none)."""
        try:
            return self._client.json("GET", self._path(""))["steps"]
        except StallfreeError as e:
            if e.status == 404:
                return []
            raise

    def load(self, step=None, map_location=None, **load_args):
        """This rank's state at ``step`` (default: the newest committed step),
        with tensors on CPU unless ``map_location`` says otherwise; None when
        nothing is committed yet. ``load_args`` go to ``torch.load`` as they
        are: ``weights_only=False`` for a state holding objects torch ≥ 2.6
        no longer unpickles by default (numpy arrays, one's own classes)."""
        steps = self.steps()
        if not steps:
            if step is None:
                return None
            raise KeyError(f"checkpoint {self.name} has no committed step")
        if step is None:
            entry = steps[-1]
        else:
            entry = next((s for s in steps if s["step"] == int(step)), None)
            if entry is None:
                raise KeyError(f"checkpoint {self.name} has no committed step {step} "
                               f"(committed: {[s['step'] for s in steps]})")
        mine = sorted((p for p in entry["parts"] if (_parse_part(p) or (None,))[0] == self.rank),
                      key=lambda p: _parse_part(p)[1])
        if not mine:
            raise KeyError(f"checkpoint {self.name} step {entry['step']} has no part of rank {self.rank}")
        sizes = {p["part"]: p["bytes"] for p in
                 self._client.json("GET", self._path(f"/steps/{entry['step']}/parts"))["parts"]}
        maps = self._map_local(entry["step"], mine, sizes)
        try:
            if all(m is not None for m in maps):
                # Every part is the local node's own checked copy, mapped
                # where it lies: nothing crossed a socket, nothing to hash.
                f = _ChainFile([memoryview(m) for m in maps])
            else:
                f = _ViewFile(memoryview(self._fetch(entry["step"], mine, sizes, maps)))
            # torch.load reads the buffers in place: io.BytesIO would copy
            # the whole state once more first.
            return _torch().load(f, map_location=map_location if map_location is not None else "cpu", **load_args)
        finally:
            f = None
            for m in maps:
                if m is not None:
                    try:
                        m.close()
                    except BufferError:  # a view still held somewhere: unmapped when collected
                        pass

    def _map_local(self, step, parts, sizes):
        """Each part's mapping where the node on this host holds it in shared
        memory (GET ?map=1 over its Unix socket, issue 50), else None."""
        base = self._client.urls[0]
        sock = _socket_path(base) or self._client._socket_of(base)
        if not sock:
            return [None] * len(parts)
        headers = {"Authorization": "Bearer " + self.token} if self.token else {}
        out = [None] * len(parts)
        conn = _UnixHTTPConnection(sock, self.timeout)
        try:
            for i, p in enumerate(parts):
                conn.request("GET", self._path(f"/steps/{step}/parts/{p}") + "?map=1", headers=headers)
                r = conn.getresponse()
                path = r.getheader("X-Checkpoint-Map")
                ino, dev = r.getheader("X-Checkpoint-Map-Ino", ""), r.getheader("X-Checkpoint-Map-Dev", "")
                r.read()  # empty: a 204 (nothing to map here) or the map's headers
                if r.status != 200 or not path:
                    break  # not held here in shared memory: the rest is fetched
                ident = (int(dev), int(ino)) if ino.isdigit() and dev.isdigit() else None
                out[i] = _map_readonly(path, sizes[p], ident)
        except (OSError, http.client.HTTPException):
            pass  # the socket is an optimisation: what is not mapped is fetched
        finally:
            conn.close()
        return out

    def _fetch(self, step, parts, sizes=None, have=None):
        """This rank's parts of a step, read in parallel straight into one
        buffer and checked against their checksums as they arrive; a part
        already mapped (``have``) is copied from its mapping."""
        if sizes is None:
            sizes = {p["part"]: p["bytes"] for p in
                     self._client.json("GET", self._path(f"/steps/{step}/parts"))["parts"]}
        offsets, total = [], 0
        for p in parts:
            offsets.append(total)
            total += sizes[p]
        buf = bytearray(total)
        mv = memoryview(buf)
        jobs = []
        for i, (p, off) in enumerate(zip(parts, offsets)):
            out = mv[off:off + sizes[p]]
            if have is not None and have[i] is not None:
                out[:] = have[i]
            else:
                jobs.append((p, out))
        if len(jobs) > 1 and self.parallel > 1:
            with concurrent.futures.ThreadPoolExecutor(max_workers=self.parallel) as ex:
                for f in [ex.submit(self._get_into, step, p, out) for p, out in jobs]:
                    f.result()
        else:
            for p, out in jobs:
                self._get_into(step, p, out)
        return buf

    def _get_into(self, step, part, out):
        """GETs a part into ``out`` (its exact size), hashing as it reads; on
        a failure, the other nodes are tried through the client."""
        path = self._path(f"/steps/{step}/parts/{part}")
        u = urllib.parse.urlsplit(self._client.urls[0])
        headers = {"Authorization": "Bearer " + self.token} if self.token else {}
        conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=self.timeout)
        try:
            conn.request("GET", path, headers=headers)
            r = conn.getresponse()
            want = r.getheader("X-Checksum")
            # None: a crc32c part and no crc32c module here; the node keeps
            # only checked parts and checks every other copy as it streams.
            h = _Summer.for_header(want)
            if r.status == 200 and r.length == len(out):
                off = 0
                while off < len(out):
                    n = r.readinto(out[off:off + (8 << 20)])
                    if not n:
                        break
                    if h is not None:
                        h.update(out[off:off + n])
                    off += n
                if off == len(out) and (h is None or _same_sum(h.header(), want)):
                    return
        except (OSError, http.client.HTTPException):
            pass
        finally:
            conn.close()
        data = self._get(step, part, len(out))  # another node, through the client's fail-over
        if len(data) != len(out):
            raise StallfreeError(502, f"checkpoint {self.name} step {step} part {part}: {len(data)} bytes, "
                                      f"want {len(out)}")
        out[:] = data

    def _get(self, step, part, size=None):
        """A part's bytes, checked against the answer's checksum; no more than
        size bytes and one are read (the listed size: a node answering more
        is wrong, and an endless answer would fill this process's memory)."""
        def bounded(r):
            data = r.read(size + 1)
            if len(data) > size:  # raised inside the read: the client drops the connection, body unread
                raise StallfreeError(502, f"checkpoint {self.name} step {step} part {part}: more than its "
                                          f"{size} bytes")
            return data

        r, data = self._client.request("GET", self._path(f"/steps/{step}/parts/{part}"),
                                       reader=None if size is None else bounded)
        want = r.getheader("X-Checksum")
        h = _Summer.for_header(want)
        if h is not None:
            h.update(data)
        if h is not None and not _same_sum(h.header(), want):
            raise StallfreeError(502, f"checkpoint {self.name} step {step} part {part}: checksum mismatch")
        return data

    # -- interval --------------------------------------------------------------

    def auto(self, step_time, state=None):
        """Picks how many steps to leave between saves, CheckFreq's way: the
        snapshot (the time the loop is held) must stay within 3.5% of the
        training time between two saves, and the background upload must end
        before the next save starts (one in flight). Both are measured: the
        last save's, or with ``state``, a snapshot timed now (upload
        estimated at the snapshot's rate until a save measures it). Returns
        the interval in steps and keeps it in ``self.interval``."""
        step_time = float(step_time)
        if step_time <= 0:
            raise ValueError("step_time must be positive")
        snap, upload = self.snapshot_seconds, self.upload_seconds
        if snap is None and state is not None:
            t0 = time.perf_counter()
            buf = io.BytesIO()
            _torch().save(state, buf)
            snap = time.perf_counter() - t0
            del buf
        if snap is None:
            self.interval = 1  # nothing measured yet: save once to measure
            return 1
        if upload is None:
            upload = snap
        self.interval = max(1, math.ceil(snap / (MAX_OVERHEAD * step_time)), math.ceil(upload / step_time))
        return self.interval

    def overhead(self, step_time):
        """The fraction of training time the last measured snapshot costs at
        the current interval."""
        if self.snapshot_seconds is None or not self.interval:
            return None
        return self.snapshot_seconds / (self.interval * float(step_time))

    def maybe_save(self, step, state, meta=None):
        """save() when ``step`` is a multiple of the interval auto() chose;
        returns the Future, or None when this step is not saved."""
        if self.interval and int(step) % self.interval == 0:
            return self.save(step, state, meta)
        return None

    # -- misc ----------------------------------------------------------------

    def _path(self, rest):
        return "/v1/checkpoints/" + urllib.parse.quote(self.name, safe="") + rest

    def close(self):
        """Waits for the save in flight and stops the upload thread."""
        self._executor.shutdown(wait=True)
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


__all__ = ["Checkpointer", "part_names", "PART_BYTES", "MAX_OVERHEAD"]
