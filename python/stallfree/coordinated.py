"""Coordinated prep (docs/api.md): the J jobs of a hyper-parameter search
prepare each batch once and share it through the cluster.

Every job of a group reads the same dataset in the same seeded order. Batch
b of an epoch is prepared (fetched, transformed, collated) by one job, the
producer, which stages it at the group's owner node
(``PUT /v1/groups/{g}/epochs/{e}/batches/{b}?job=K``); the other jobs read
it (``GET ...?job=K&wait=30s``). Every job therefore yields the very same
batches: the same samples with the same augmentation.

The producer of a batch is computed by every job alike (``producer`` below,
the same rule as Go's ``groups.Producer``): job ``b mod J`` unless it is
detached; a detached job's batches go round-robin over the attached jobs.
A job the node detaches (410: too far behind, or silent for
``--group-timeout``) goes on alone: it prepares every remaining batch itself,
in the same order, so it sees each sample once, without a gap or a repeat.

Augmentation is reproducible: before preparing batch b of epoch e, the
preparing process seeds ``random``, numpy's global generator and (when
loaded) torch's from (group seed, e, b). A job that prepares a batch alone
after being detached gives the batch it would have read.

Batches travel as msgpack with numpy arrays and torch tensors carried as
(dtype, shape, raw bytes) — never pickle, so a staged batch cannot run code
in the jobs that read it. Supported in a collated batch: numpy arrays and
scalars, torch tensors, lists, tuples, dicts, str, bytes, int, float, bool,
None.
"""

import collections
import concurrent.futures
import http.client
import json
import multiprocessing
import os
import random
import sys
import threading
import time
import urllib.parse

import msgpack

from .client import Client, StallfreeError

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is expected
    np = None

__all__ = ["CoordinatedLoader", "producer", "epoch_order", "encode_batch", "decode_batch", "Detached"]


# -- the group's rules, as every job computes them ---------------------------

def epoch_order(seed, epoch, n):
    """The group's order of sample indices for an epoch: a permutation of
    range(n), the same in every process."""
    order = list(range(n))
    random.Random(int(seed) * 1_000_003 + int(epoch)).shuffle(order)
    return order


def producer(jobs, batches, detached, pos):
    """The job index preparing the batch at position pos (epoch*batches + b),
    given [(job, from_pos)] of detached jobs; -1 when none is attached.
    Mirrors Go's groups.Producer."""
    if jobs < 1 or batches < 1:
        return -1
    b = pos % batches
    base = b % jobs
    d = sorted({j for j, frm in detached if frm <= pos and 0 <= j < jobs})
    if base not in d:
        return base
    attached = [j for j in range(jobs) if j not in d]
    if not attached:
        return -1
    return attached[((b // jobs) * len(d) + d.index(base)) % len(attached)]


def batch_seed(seed, epoch, b):
    """The random seed a batch is prepared under (any job, any process)."""
    return (int(seed) * 0x9E3779B1 + int(epoch) * 1_000_003 + int(b)) % (2 ** 63)


# -- batches on the wire ------------------------------------------------------

_ND, _TENSOR, _TUPLE = 1, 2, 3


def _default(obj):
    if np is not None and isinstance(obj, (np.ndarray, np.generic)):
        a = np.ascontiguousarray(obj)
        return msgpack.ExtType(_ND, msgpack.packb([a.dtype.str, list(a.shape), a.tobytes()], use_bin_type=True))
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        a = obj.detach().cpu().contiguous().numpy()
        return msgpack.ExtType(_TENSOR, msgpack.packb([a.dtype.str, list(a.shape), a.tobytes()], use_bin_type=True))
    if isinstance(obj, tuple):
        return msgpack.ExtType(_TUPLE, encode_batch(list(obj)))
    raise TypeError(f"coordinated prep cannot send a {type(obj).__name__} in a batch")


def _ext_hook(code, data):
    if code in (_ND, _TENSOR):
        dtype, shape, raw = msgpack.unpackb(data, raw=False)
        a = np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape)
        if code == _TENSOR:
            import torch  # a tensor was sent, so the job that made it has torch
            return torch.from_numpy(a.copy())
        return a
    if code == _TUPLE:
        return tuple(decode_batch(data))
    return msgpack.ExtType(code, data)


def encode_batch(batch):
    """Bytes of a collated batch (see the module's docstring for the types)."""
    return msgpack.packb(batch, default=_default, use_bin_type=True, strict_types=True)


def decode_batch(data):
    """The batch encode_batch made (numpy arrays are read-only views)."""
    return msgpack.unpackb(data, ext_hook=_ext_hook, raw=False, strict_map_key=False)


def default_collate(samples):
    """torch's default_collate when torch is loaded; otherwise numpy arrays
    stacked, numbers into arrays, tuples/lists/dicts field by field, anything
    else as a list."""
    torch = sys.modules.get("torch")
    if torch is not None:
        from torch.utils.data import default_collate as tc
        return tc(samples)
    first = samples[0]
    if np is not None and isinstance(first, np.ndarray):
        return np.stack(samples)
    if isinstance(first, (bool, int, float)) or (np is not None and isinstance(first, np.generic)):
        return np.array(samples) if np is not None else list(samples)
    if isinstance(first, dict):
        return {k: default_collate([s[k] for s in samples]) for k in first}
    if isinstance(first, (tuple, list)):
        return type(first)(default_collate(list(f)) for f in zip(*samples))
    return list(samples)


# -- preparing a batch (in the job's process or in a worker process) ----------

class _Prep:
    """Fetches a batch's samples, transforms and collates them, under the
    batch's seed. One per process; workers get theirs by fork."""

    def __init__(self, url, token, dataset, tar, transform, collate_fn, seed):
        self.url, self.token, self.dataset, self.tar = url, token, dataset, tar
        self.transform, self.collate_fn, self.seed = transform, collate_fn, seed
        self._client = None
        self._pid = None
        # The generators are the process's own: two threads preparing at
        # once would draw from them in turn and make each other's batches
        # irreproducible, so one batch is transformed at a time per process.
        self._seeded = threading.Lock()

    def __getstate__(self):
        s = dict(self.__dict__)
        s["_client"], s["_seeded"] = None, None
        return s

    def __setstate__(self, s):
        self.__dict__.update(s)
        self._seeded = threading.Lock()

    @property
    def client(self):
        if self._client is None or self._pid != os.getpid():
            self._client, self._pid = Client(self.url, token=self.token), os.getpid()
        return self._client

    def __call__(self, epoch, b, indices):
        if self.tar:
            raw = self.client.samples(self.dataset, indices)
        else:
            raw = [d for _, d in self.client.batch(self.dataset, indices)]
        s = batch_seed(self.seed, epoch, b)
        with self._seeded:
            random.seed(s)
            if np is not None:
                np.random.seed(s % (2 ** 32))
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.manual_seed(s)
            samples = [self.transform(x) for x in raw] if self.transform else raw
        return encode_batch(self.collate_fn(samples))


_worker_prep = None


def _worker_init(prep):
    global _worker_prep
    _worker_prep = prep


def _worker_run(args):
    return _worker_prep(*args)


# -- the loader ----------------------------------------------------------------

Detached = collections.namedtuple("Detached", "job from_pos")


class _Answer(Exception):
    def __init__(self, status, message, producer_hint):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message, self.producer = status, message, producer_hint


class CoordinatedLoader:
    """An iterable of minibatches of a coordinated-prep group.

    ``url`` is a node (``http://HOST:PORT``), ``group`` the group's name,
    ``job_index`` this job's index in 0..J-1, ``dataset`` the cluster dataset
    the group reads, ``transform`` what turns an item's bytes (a tar
    dataset's sample dict) into a training sample, ``batch_size`` the
    group's batch size, ``num_workers`` worker processes preparing this
    job's share (0: threads of this process).

    The loader creates the group when ``jobs`` (J) is given (the same
    definition again is fine) and joins it otherwise. ``seed`` fixes the
    epoch order and the augmentation, ``window`` is W. ``wait`` is how long
    one read waits for a batch before asking again.

    ``set_epoch(e)`` picks the epoch, ``len()`` is batches per epoch (the
    last may be short: every sample once), ``state_dict()`` /
    ``load_state_dict()`` resume an epoch after the last batch yielded.
    ``calls`` counts the samples this job transformed; ``alone`` says
    whether the group detached it.
    """

    def __init__(self, url, group, job_index, dataset, transform=None, batch_size=32, num_workers=0, *,
                 jobs=None, seed=0, window=None, token=None, collate_fn=None, wait=30.0):
        self.url, self.group, self.job = url.rstrip("/"), group, int(job_index)
        self.dataset, self.transform, self.batch_size = dataset, transform, int(batch_size)
        self.num_workers, self.token, self.wait = int(num_workers), token, float(wait)
        self.collate_fn = collate_fn or default_collate
        self.client = Client(self.url, token=token)
        self._lock = threading.Lock()
        gq = urllib.parse.quote(group, safe="")
        self._gpath = f"/v1/groups/{gq}"
        spec = None
        if jobs is not None:
            spec = {"dataset": dataset, "seed": int(seed), "batch_size": self.batch_size, "jobs": int(jobs)}
            if window is not None:
                spec["window"] = int(window)
        info = self._define(spec)
        if info["dataset"] != dataset or info["batch_size"] != self.batch_size:
            raise ValueError(f"group {group!r} reads {info['dataset']!r} in batches of {info['batch_size']}, "
                             f"not {dataset!r} in batches of {self.batch_size}")
        if not 0 <= self.job < len(info["jobs"]):
            raise ValueError(f"job_index {self.job}: group {group!r} has jobs 0..{len(info['jobs']) - 1}")
        self.alone = False
        self._apply(info)
        self.seed = int(info["seed"])
        self.samples, self.batches, self.jobs = int(info["samples"]), int(info["batches"]), len(info["jobs"])
        self.window = int(info["window"])
        tar = bool(self.client.dataset(dataset).get("samples"))
        self._prep = _Prep(self.url, token, dataset, tar, transform, self.collate_fn, self.seed)
        self.epoch, self._start = 0, 0
        self._next = 0  # the next batch of the current epoch to yield
        self.calls = 0
        self._pool = None
        self._io = None
        self._local = threading.local()
        u = urllib.parse.urlsplit(self.url)
        self._host, self._port = u.hostname, u.port or 80

    # -- group state ---------------------------------------------------------

    def _define(self, spec, patience=60.0):
        """PUTs the group (spec) or reads it (None); a cluster without a
        leader for a moment (503) is waited for, up to patience seconds."""
        deadline = time.monotonic() + patience
        while True:
            try:
                if spec is None:
                    return self.client.json("GET", self._gpath)
                return self.client.json("PUT", self._gpath, spec)
            except StallfreeError as e:
                if e.status != 503 or time.monotonic() > deadline:
                    raise
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def _apply(self, info):
        with self._lock:
            self._detached = [(j["job"], j["from"]) for j in info["jobs"] if j.get("detached")]
            if any(j == self.job for j, _ in self._detached):
                self.alone = True

    def _refresh(self):
        try:
            self._apply(self.client.json("GET", self._gpath))
        except (StallfreeError, OSError):
            pass  # the next request will tell

    def producer_of(self, epoch, b):
        """The job that prepares batch b of epoch, as this job knows the
        group now."""
        with self._lock:
            detached = list(self._detached)
        return producer(self.jobs, self.batches, detached, int(epoch) * self.batches + int(b))

    # -- epochs --------------------------------------------------------------

    def set_epoch(self, epoch):
        self.epoch, self._start = int(epoch), 0

    def __len__(self):
        return self.batches

    def indices(self, epoch, b):
        """The sample indices of batch b of epoch, in the group's order."""
        order = epoch_order(self.seed, epoch, self.samples)
        return order[b * self.batch_size:(b + 1) * self.batch_size]

    def state_dict(self):
        """Where this job is: enough to resume after the last batch yielded."""
        return {"group": self.group, "job": self.job, "epoch": self.epoch, "batch": self._next, "alone": self.alone}

    def load_state_dict(self, state):
        if state["group"] != self.group or state["job"] != self.job:
            raise ValueError(f"state of job {state['job']} of group {state['group']!r}, not job {self.job} of {self.group!r}")
        self.epoch, self._start, self._next = int(state["epoch"]), int(state["batch"]), int(state["batch"])
        self.alone = self.alone or bool(state.get("alone"))

    def __iter__(self):
        epoch, start = self.epoch, self._start
        self._start = 0
        self._ensure_pools()
        # Batches in flight (asked for, or being prepared here): half the
        # window. The group prepares about that many batches at once, and
        # the other half is slack for jobs drifting apart, so read-ahead
        # alone does not put a job more than W batches ahead of another.
        depth = max(1, self.window // 2)
        pending = collections.deque()
        nxt = start
        try:
            for k in range(start, self.batches):
                while nxt < self.batches and len(pending) < depth:
                    pending.append(self._io.submit(self._obtain, epoch, nxt))
                    nxt += 1
                data = pending.popleft().result()
                self._next = k + 1
                yield decode_batch(data)
        finally:
            for f in pending:
                f.cancel()
        # A finished pass moves on, so that iterating again without
        # set_epoch reads the next epoch, not one the group has dropped.
        self.epoch, self._next = epoch + 1, 0

    # -- one batch -------------------------------------------------------------

    def _obtain(self, epoch, b):
        """The bytes of batch b: read from the stage, or prepared here (and
        staged for the others when this job is its producer)."""
        waited = 0  # reads of this batch that waited in vain
        while True:
            if self.alone:
                return self._prepare(epoch, b)
            p = self.producer_of(epoch, b)
            try:
                if p == self.job:
                    data = self._prepare(epoch, b)
                    return self._stage(epoch, b, data)
                return self._call("GET", epoch, b, None, self.wait)
            except _Answer as a:
                if a.status == 410:
                    self.alone = True
                    continue
                if a.status == 503:  # the owner or the leader is out of reach a moment
                    time.sleep(0.2)
                    continue
                if a.status != 404:
                    raise StallfreeError(a.status, a.message) from None
                if a.producer == -1:  # dropped, or nobody left: make it here
                    return self._prepare(epoch, b)
                if a.producer != self.job:
                    waited += 1
                    if waited >= 3:
                        # Its producer is alive (not detached) but the batch
                        # never came: staged at an owner that has since changed
                        # (a node joined or left). Make it here; the seeded
                        # augmentation gives the same bytes, and a copy staged
                        # meanwhile wins (409).
                        return self._stage(epoch, b, self._prepare(epoch, b))
                    self._refresh()
                    continue
                # The node says this job prepares it (it took over a detached
                # job's share): its answer counts, whatever this job knew.
                self._refresh()
                return self._stage(epoch, b, self._prepare(epoch, b))

    def _stage(self, epoch, b, data):
        """PUTs this job's batch; returns the bytes every job reads for it."""
        while True:
            try:
                self._call("PUT", epoch, b, data, self.wait)
                return data
            except _Answer as a:
                if a.status == 409:  # staged first with other bytes: those count
                    try:
                        return self._call("GET", epoch, b, None, self.wait)
                    except _Answer as g:
                        if g.status == 410:
                            self.alone = True
                        return data
                if a.status == 410:
                    self.alone = True
                    return data
                if a.status == 503:  # the stage is full (the others are reading) or out of reach a moment
                    time.sleep(0.05)
                    continue
                raise StallfreeError(a.status, a.message) from None

    def _prepare(self, epoch, b):
        idx = self.indices(epoch, b)
        with self._lock:
            self.calls += len(idx) if self.transform else 0
        if self._pool is not None:
            return self._pool.apply_async(_worker_run, ((epoch, b, idx),)).get()
        return self._prep(epoch, b, idx)

    # -- plumbing -----------------------------------------------------------------

    def _ensure_pools(self):
        if self._pool is None and self.num_workers > 0:
            # Forked before this loader starts any thread of its own, as
            # DataLoader does; the transform need not be picklable.
            ctx = multiprocessing.get_context("fork")
            self._pool = ctx.Pool(self.num_workers, initializer=_worker_init, initargs=(self._prep,))
        if self._io is None:
            self._io = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(1, self.window // 2) + 1,
                thread_name_prefix="stallfree-group")

    def _conn(self):
        c = getattr(self._local, "conn", None)
        if c is None:
            c = self._local.conn = http.client.HTTPConnection(self._host, self._port, timeout=self.wait + 60)
        return c

    def _call(self, method, epoch, b, body, wait):
        path = f"{self._gpath}/epochs/{int(epoch)}/batches/{int(b)}?job={self.job}&wait={wait}s"
        h = {"Connection": "keep-alive"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if body is not None:
            h["Content-Type"] = "application/octet-stream"
        for attempt in range(5):
            c = self._conn()
            try:
                c.request(method, path, body=body, headers=h)
                r = c.getresponse()
                data = r.read()
                break
            except (OSError, http.client.HTTPException):
                c.close()
                self._local.conn = None
                if attempt == 4:
                    raise
        if r.status < 300:
            return data
        try:
            msg = json.loads(data).get("error", "")
        except ValueError:
            msg = data.decode(errors="replace")
        try:
            hint = int(r.getheader("X-Group-Producer", ""))
        except ValueError:
            hint = None
        raise _Answer(r.status, msg, hint)

    def close(self):
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None
        if self._io is not None:
            self._io.shutdown(wait=False, cancel_futures=True)
            self._io = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
