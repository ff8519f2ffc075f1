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

A batch travels as one small header and its arrays' raw bytes (see
"batches on the wire" below), never pickle, so a staged batch cannot run
code in the jobs that read it; a reader's arrays are views of what it read,
not copies. On the group owner's host a job maps the node's shared-memory
copy of the batch instead of reading it over a socket. Supported in a
collated batch: numpy arrays and scalars, torch tensors, lists, tuples,
dicts, str, bytes, int, float, bool, None.

Prep-cache route (``cache_stage=(STAGE, F)``, usually with ``augment``):
the group's deterministic stage F is kept in the prep cache (a derived
dataset, ``stallfree.prep``). While some item is not written, batches are
staged as above, each holding F's outputs (stacked), which the producer
computes for the items not written yet and writes back (write-once). Once
every item is written (the derived dataset's ``written`` reaches its item
count, looked at when an epoch starts), the job stops exchanging anything:
it reads its batch's arrays from the prep cache in one batch request,
straight into one buffer, and augments them itself. ``augment`` is seeded
per sample by (group seed, epoch, index), so every job makes the same batch.
"""

import collections
import concurrent.futures
import http.client
import json
import mmap
import multiprocessing
import os
import random
import sys
import threading
import time
import urllib.parse
import weakref

import msgpack

from ._forked import one_intraop_thread
from .client import _UnixHTTPConnection, Client, StallfreeError
from .labels import Labels
from ._pool import REUSE_FROM, _Pool, _ProcessPool
from .prep import PrepStage

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
#
# A staged batch is one small header and the arrays' raw bytes:
#
#   b"SFB2" | header length (u32, little-endian) | header | padding | arrays
#
# The header is the batch's structure in msgpack, each array replaced by an
# ext naming its dtype, shape and where its bytes start (a multiple of 64
# from the buffer's start). A reader's arrays are views of the buffer it got
# (a mapped shared-memory file, or the body it read): no copy, no per-array
# msgpack. Never pickle: a staged batch cannot run code in the jobs that read it.

_ND, _TENSOR, _TUPLE = 1, 2, 3
_MAGIC = b"SFB2"
_ALIGN = 64


class _Stacked:
    """numpy arrays of one dtype and shape, to be stacked straight into the
    encoded batch (as numpy arrays, or as a tensor when ``tensor``): what
    default_collate would make, without an array of its own."""

    def __init__(self, rows, tensor=False):
        self.rows, self.tensor = rows, tensor
        self.dtype = rows[0].dtype
        self.shape = (len(rows),) + rows[0].shape
        self.nbytes = rows[0].nbytes * len(rows)

    @staticmethod
    def of(rows, tensor=False):
        """A _Stacked of rows, or None when they are not all numpy arrays of
        one dtype and shape."""
        if np is None or not rows or not all(type(r) is np.ndarray for r in rows):
            return None
        first = rows[0]
        if first.dtype.hasobject or any(r.shape != first.shape or r.dtype != first.dtype for r in rows):
            return None
        return _Stacked(rows, tensor)


def _arrays_out(batch, arrays):
    """batch's structure with each array replaced by an ext pointing at its
    slot; the arrays (contiguous numpy, or _Stacked) appended to arrays."""
    def default(obj):
        code = None
        if isinstance(obj, _Stacked):
            a, code = obj, (_TENSOR if obj.tensor else _ND)
        elif np is not None and isinstance(obj, (np.ndarray, np.generic)):
            a, code = np.ascontiguousarray(obj), _ND
        else:
            torch = sys.modules.get("torch")
            if torch is not None and isinstance(obj, torch.Tensor):
                a, code = obj.detach().cpu().contiguous().numpy(), _TENSOR
        if code is not None:
            arrays.append(a)
            return msgpack.ExtType(code, msgpack.packb([a.dtype.str, list(a.shape), len(arrays) - 1]))
        if isinstance(obj, tuple):
            return msgpack.ExtType(_TUPLE, msgpack.packb(list(obj), default=default, use_bin_type=True, strict_types=True))
        raise TypeError(f"coordinated prep cannot send a {type(obj).__name__} in a batch")
    try:
        return msgpack.packb(batch, default=default, use_bin_type=True, strict_types=True)
    finally:
        # As decode_batch's ext_hook: default refers to itself through its
        # closure, which holds arrays. The cycle kept every batch's arrays
        # (a producer's pooled rows) until the cyclic GC ran, so the pool
        # found none free and made a fresh 9 MB buffer for almost every other
        # batch, whose pages then cost more to fault in than F's decode
        # (BENCHMARKS.md, "A producer's rows, freed when encoded").
        del default


def _pad(n):
    return -n % _ALIGN


def _layout(batch):
    """(prefix, [(offset, array or _Stacked)], size) of batch's encoding:
    the prefix is the magic, the header's length and the header; each
    array's bytes start at its offset, and zeros fill the gaps."""
    arrays = []
    structure = _arrays_out(batch, arrays)
    offsets, off = [], 0
    # Offsets are final once the header's size is: place the arrays after a
    # header written with them, growing it until it fits (twice at most).
    for _ in range(3):
        start = len(_MAGIC) + 4 + len(structure) + 16 * len(arrays) + 64
        start += _pad(start)
        offsets, off = [], start
        for a in arrays:
            offsets.append(off)
            off += a.nbytes + _pad(a.nbytes)
        header = msgpack.packb([structure, offsets])
        if len(_MAGIC) + 4 + len(header) <= start:
            break
    return _MAGIC + len(header).to_bytes(4, "little") + header, list(zip(offsets, arrays)), off


def encode_batch(batch, alloc=None):
    """Bytes of a collated batch (see the module's docstring for the types).
    With ``alloc(n)`` (a writable buffer of n bytes, e.g. a reused numpy
    array), the batch is written into that buffer, which is returned: no
    fresh allocation and no copy into bytes."""
    prefix, slots, size = _layout(batch)
    buf = alloc(size) if alloc is not None else bytearray(size)
    out = memoryview(buf).cast("B")
    end = len(prefix)
    out[:end] = prefix
    for o, a in slots:
        if alloc is not None and o > end:  # a reused buffer: the padding is zeroed, as bytearray's is
            out[end:o] = bytes(o - end)
        if isinstance(a, _Stacked):
            if a.nbytes:
                np.stack(a.rows, out=np.frombuffer(buf, dtype=a.dtype, count=a.nbytes // a.dtype.itemsize,
                                                   offset=o).reshape(a.shape))
        else:
            out[o:o + a.nbytes] = memoryview(a.reshape(-1).view(np.uint8)) if a.nbytes else b""
        end = o + a.nbytes
    if alloc is not None:
        if size > end:
            out[end:size] = bytes(size - end)
        return buf
    return bytes(out)


def _pieces(batch):
    """encode_batch's bytes as a list of buffers, in order: the arrays (each
    row of a stack) are their own memory, not copies, so that writing the
    list out copies every byte once."""
    prefix, slots, size = _layout(batch)
    out, end = [prefix], len(prefix)
    for o, a in slots:
        if o > end:
            out.append(bytes(o - end))
        for r in (a.rows if isinstance(a, _Stacked) else [a]):
            if r.nbytes:  # as bytes: a dtype without a buffer format (datetime64) too
                out.append(memoryview(np.ascontiguousarray(r).reshape(-1).view(np.uint8)))
        end = o + a.nbytes
    if size > end:
        out.append(bytes(size - end))
    return out


def decode_batch(data):
    """The batch encode_batch made. Arrays and tensors are views of data, not
    copies: writable when data is (a bytearray, a private mapping), read-only
    numpy arrays (and tensors copied) when it is bytes."""
    view = memoryview(data)
    if bytes(view[:4]) != _MAGIC:
        raise ValueError("not a staged batch (bad magic)")
    n = int.from_bytes(view[4:8], "little")
    structure, offsets = msgpack.unpackb(view[8:8 + n], raw=False)
    writable = not view.readonly

    def ext_hook(code, payload):
        if code in (_ND, _TENSOR):
            dtype, shape, k = msgpack.unpackb(payload, raw=False)
            dt = np.dtype(dtype)
            count = int(np.prod(shape)) if shape else 1
            a = np.frombuffer(data, dtype=dt, count=count, offset=offsets[k]).reshape(shape)
            if code == _TENSOR:
                import torch  # a tensor was sent, so the job that made it has torch
                return torch.from_numpy(a if writable else a.copy())
            return a
        if code == _TUPLE:
            return tuple(msgpack.unpackb(payload, ext_hook=ext_hook, raw=False, strict_map_key=False))
        return msgpack.ExtType(code, payload)

    try:
        return msgpack.unpackb(structure, ext_hook=ext_hook, raw=False, strict_map_key=False)
    finally:
        # ext_hook refers to itself (tuples nest) through its closure, which
        # holds data: a cycle that would keep the batch's buffer (a mapped
        # file, a pooled buffer) alive until the cyclic GC runs. Break it.
        del ext_hook


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

def _stack(arrays):
    """F's outputs (numpy arrays or torch tensors of one shape) as one batch."""
    torch = sys.modules.get("torch")
    if torch is not None and arrays and isinstance(arrays[0], torch.Tensor):
        return torch.stack(arrays)
    return np.stack(arrays)


class _Prep:
    """Fetches a batch's samples, transforms and collates them, under the
    batch's seed; with a prep stage, gets F's outputs for them (computing
    and writing back the ones not written) and stacks them (a stack of
    numpy rows is left to the encoding, which writes each row once).
    Returns (the batch, encoded unless asked not to, how many items F ran
    on). One per process; workers get theirs by fork."""

    def __init__(self, url, token, dataset, tar, transform, collate_fn, seed, labels=None, stage=None):
        self.url, self.token, self.dataset, self.tar = url, token, dataset, tar
        self.transform, self.collate_fn, self.seed = transform, collate_fn, seed
        self.labels = labels  # a stallfree.labels.Labels, or None
        self.stage = stage  # a stallfree.prep.PrepStage, or None
        self.alloc = None  # in the job's own process: buffers reused once nothing refers to them
        self._client = None
        self._pid = None
        # Buffers for F's outputs (_rows). A buffer is busy while any row of
        # it lives: until its batch is encoded (or, uncollated, for as long
        # as the caller keeps it).
        self._rows_pool = _ProcessPool(keep=4)
        # The generators are the process's own: two threads preparing at
        # once would draw from them in turn and make each other's batches
        # irreproducible, so one batch is transformed at a time per process.
        self._seeded = threading.Lock()

    def __getstate__(self):
        s = dict(self.__dict__)
        s["_client"], s["_seeded"], s["alloc"] = None, None, None
        return s

    def __setstate__(self, s):
        self.__dict__.update(s)
        self._seeded = threading.Lock()

    @property
    def client(self):
        if self._client is None or self._pid != os.getpid():
            self._client, self._pid = Client(self.url, token=self.token), os.getpid()
        return self._client

    def __call__(self, epoch, b, indices, encoded=True):
        """(the batch, encoded unless not encoded, how many items F ran on)."""
        batch, computed = self.stage_batch(indices) if self.stage is not None else (self.batch(epoch, b, indices), 0)
        return (encode_batch(batch, self.alloc) if encoded else batch), computed

    def batch(self, epoch, b, indices):
        """The collated batch of indices (with labels: the pair)."""
        if self.tar:
            raw = self.client.samples(self.dataset, indices)
            keys = [d["__key__"] for d in raw]
        else:
            pairs = self.client.batch(self.dataset, indices)
            keys, raw = [k for k, _ in pairs], [d for _, d in pairs]
        samples = self.seeded(epoch, b, lambda: self._rows(self.transform, raw) if self.transform else raw)
        torch = sys.modules.get("torch")
        x = None
        if self.collate_fn is default_collate:
            # default_collate's result (a stack; a tensor when torch is
            # loaded), written straight into the encoded batch.
            x = _Stacked.of(samples, tensor=torch is not None)
        if x is None:
            x = self.collate_fn(samples)
        if self.labels is None:
            return x
        y = self.labels.of(indices, keys)
        return x, torch.from_numpy(y) if torch is not None else y

    def _rows(self, fn, items):
        """[fn(x) for x in items], where each output that is a numpy array
        of the first one's dtype and shape is copied at once into its row of
        one (B, ...) buffer, reused from batch to batch, and let go: fn's
        own memory is then freed before its next call, and reused by it.
        Kept until the batch is encoded, B fresh outputs (B x 549 KiB for a
        decoded 500x375 JPEG) were freed together, glibc's trim gave them
        back to the kernel, and the next batch's fn faulted them in again:
        ~140 page faults an image, a third of its decode's CPU in a
        producer's threads (the group bench's "where" line). The rows are
        views; the encoding copies them into the staged batch."""
        if np is None:
            return [fn(x) for x in items]
        out, rows = [], None
        for x in items:
            y = fn(x)
            if rows is None and not out and type(y) is np.ndarray and y.nbytes >= REUSE_FROM \
                    and not y.dtype.hasobject:
                shape = (len(items),) + y.shape
                rows = self._rows_pool.get(y.nbytes * len(items)).view(y.dtype).reshape(shape)
            if rows is not None and type(y) is np.ndarray and y.dtype == rows.dtype and y.shape == rows.shape[1:]:
                row = rows[len(out)]
                np.copyto(row, y)
                y = row
            out.append(y)
        return out

    def stage_batch(self, indices):
        """(F's outputs for indices, stacked (with labels: and the labels, as
        numpy), how many items F ran on): F runs on the items not written
        yet."""
        want_keys = self.labels is not None and self.labels.needs_keys
        computed = []
        got = self.stage.get_many(self.client, indices, keys=want_keys, computed=computed)
        keys = None
        if want_keys:
            keys, got = [k for k, _ in got], [a for _, a in got]
        x = _Stacked.of(got) or _stack(got)
        if self.labels is None:
            return x, len(computed)
        return (x, self.labels.of(indices, keys)), len(computed)

    def seeded(self, epoch, b, fn):
        """fn() under the batch's seed (random, numpy's and torch's generators)."""
        s = batch_seed(self.seed, epoch, b)
        with self._seeded:
            random.seed(s)
            if np is not None:
                np.random.seed(s % (2 ** 32))
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.manual_seed(s)
            return fn()


_worker_prep = None


def _worker_init(prep):
    global _worker_prep
    _worker_prep = prep
    one_intraop_thread()


def _worker_run(args):
    return _worker_prep(*args)


# -- the loader ----------------------------------------------------------------

Detached = collections.namedtuple("Detached", "job from_pos")


class _Answer(Exception):
    def __init__(self, status, message, producer_hint):
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message, self.producer = status, message, producer_hint


class _Reused(Exception):
    """The path a node answered names another file by the time it is
    opened (a handed-over batch's /proc/PID/fd/N, reused after the batch's
    linger): not this batch."""


def _map_file(path, ino=None, dev=None):
    """A staged batch's shared-memory file, mapped copy-on-write: shared with
    the node and the other jobs on this host until a job writes to it. ino
    and dev, the inode and device the node named, are checked against the
    file opened."""
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if (ino is not None and st.st_ino != ino) or (dev is not None and st.st_dev != dev):
            raise _Reused(f"{path} is inode {st.st_ino} on device {st.st_dev}, not the batch's {ino} on {dev}")
        return _map_fd(fd)
    finally:
        os.close(fd)  # the mapping stays


def _map_fd(fd):
    """The file fd, mapped copy-on-write (private: a node's seal, which
    refuses shared writable mappings, allows it), its page table filled."""
    size = os.fstat(fd).st_size
    if not size:
        return b""
    m = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    _populate_read(m)
    return m


_MADV_POPULATE_READ = getattr(mmap, "MADV_POPULATE_READ", 22)


def _populate_read(m):
    """Maps every page of m in one call (madvise MADV_POPULATE_READ, Linux
    5.14) rather than in a page fault per 64 KiB (the kernel's fault-around)
    where the job's transform first touches them. On a VM whose page tables
    the hypervisor shadows, each fault is dear, and a staged batch is mapped
    afresh for every batch: cropping 224x224 out of 16 mapped 500x375 images
    cost 134-228 µs an image populated against 157-318 (BENCHMARKS.md,
    "Dropped batches' files"). On a KVM guest the same crops cost more
    populated (52 against 35-36 µs: every page is mapped, a crop touches ~60%),
    but a staging job's total was the same within the noise ("A producer's
    rows, freed when encoded"). A read populate keeps a private mapping's pages shared:
    MAP_POPULATE would break copy-on-write, copying them all. Older kernels
    refuse it (EINVAL): the faults happen as before."""
    try:
        m.madvise(_MADV_POPULATE_READ)
    except (OSError, AttributeError, ValueError):
        pass


def _memfd_of(pieces):
    """A new memfd holding the buffers of pieces, one after the other, open
    to sealing: a staged batch to hand over to the node on this host.
    write(2) into a new memfd costs less than mapping it and copying in (its
    fresh pages are never zeroed), and a batch's arrays go straight from
    where they are."""
    fd = os.memfd_create("stallfree-batch", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        views = [v for v in (memoryview(p).cast("B") for p in pieces) if v.nbytes]
        k = 0
        while k < len(views):
            n = os.writev(fd, views[k:k + 512])  # at most IOV_MAX (1024) at once
            while k < len(views) and n >= views[k].nbytes:
                n -= views[k].nbytes
                k += 1
            if n:
                views[k] = views[k][n:]
    except BaseException:
        os.close(fd)
        raise
    return fd


def _say_alive(loader_ref, stop, every):
    """The liveness thread of a CoordinatedLoader (_start_saying_alive)."""
    while not stop.wait(every):
        loader = loader_ref()
        if loader is None or loader.alone:
            return
        try:
            if not loader._say_alive_once():
                return
        except (OSError, http.client.HTTPException):
            pass  # the node out of reach a moment: the next report, or the loader's own requests, will tell
        finally:
            del loader


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

    ``labels="folder"`` or ``labels=fn(key)`` (``stallfree.labels``) makes
    each batch ``(x, y)``, y the int64 labels (a tensor when torch is
    loaded), computed by the batch's producer and staged with it.

    ``augment`` (e.g. ``stallfree.torch.augment.Compose([...])``) is called
    by every job on every batch it yields, as ``augment(x, indices,
    epoch=e, seed=<group seed>)``, x the collated batch (a tensor when torch
    is loaded), indices its sample indices (int64 numpy): it must draw its
    parameters per sample from (seed, epoch, index), as
    ``stallfree.torch.augment`` does, so that every job makes the same batch.

    ``cache_stage=(STAGE, F)`` keeps the deterministic stage F (decode,
    resize: item bytes → one numpy array or tensor, every item one dtype and
    shape) in the prep cache, the derived dataset ``DATASET.STAGE``. x is
    then F's outputs stacked, ``(B, *shape)``; ``transform``, if given,
    runs in every job on each of F's outputs (seeded per batch) and its
    results are collated instead. While the prep cache is not full, batches
    are staged (route ``"staging"``: F runs once per item in the cluster,
    at each batch's producer, which writes its outputs back). Once every
    item is written, looked at when an epoch starts, each job reads its
    batches from the prep cache itself and nothing is staged (route
    ``"prep-cache"``, for good); an item found missing (evicted) is
    computed and written again by the batch's producer, which the other
    jobs wait for (up to ``producer_patience``, 5 s; past that, a job
    computes what it misses itself for the rest of the epoch). ``route`` says
    which the current epoch took, ``stage_calls`` counts the items F ran on
    in this job.
    """

    def __init__(self, url, group, job_index, dataset, transform=None, batch_size=32, num_workers=0, *,
                 jobs=None, seed=0, window=None, token=None, collate_fn=None, wait=30.0, labels=None,
                 cache_stage=None, augment=None):
        self.url, self.group, self.job = url.rstrip("/"), group, int(job_index)
        self.dataset, self.transform, self.batch_size = dataset, transform, int(batch_size)
        self.num_workers, self.token, self.wait = int(num_workers), token, float(wait)
        self.collate_fn = collate_fn or default_collate
        self.client = Client(self.url, token=token)
        self._lock = threading.Lock()
        self._alive = None  # the liveness thread's stop event, once started
        self._timeout_s = 0.0
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
        self.labels = Labels(labels, self.client, dataset, tar) if labels is not None else None
        self.augment = augment
        self.stage = None
        if cache_stage is not None:
            if not isinstance(cache_stage, (tuple, list)) or len(cache_stage) != 2:
                raise ValueError("cache_stage: want (stage string, function)")
            if np is None:  # pragma: no cover
                raise RuntimeError("cache_stage needs numpy")
            self.stage = PrepStage(self.client, dataset, cache_stage[0], cache_stage[1], tar)
        self._prep = _Prep(self.url, token, dataset, tar, None if self.stage else transform, self.collate_fn,
                           self.seed, self.labels, self.stage)
        self._cache_route = False  # the prep cache was full when an epoch started: read it, stage nothing
        self._no_wait_epoch = None  # on that route, the epoch in which waiting for a producer ran out
        self.route = "staging"
        self._buffers = None
        self._mapper = False  # the prep-cache route's ItemMapper (None: none), looked for at its first batch
        self.epoch, self._start = 0, 0
        self._next = 0  # the next batch of the current epoch to yield
        self.calls = 0
        self.stage_calls = 0
        self._orders = {}  # epoch -> epoch_order, for the last two epochs drawn
        self._drawing = threading.Lock()
        self._pool = None
        self._io = None
        self._local = threading.local()
        u = urllib.parse.urlsplit(self.url)
        self._host, self._port = u.hostname, u.port or 80
        # A node on this host is reached through its Unix socket, and its
        # staged batches are mapped from shared memory rather than read.
        self._sock = self.client._socket_of(self.url) if u.scheme == "http" else None
        self._map = self._sock is not None
        # ...and this job's staged batches are handed over in a memfd the
        # node seals and keeps (?memfd=): written once, into memory the whole
        # host maps, with no byte through the socket or written by the node.
        self._handoff = self._map and hasattr(os, "memfd_create")
        self.handed_over = 0  # batches this job staged by handing them over
        # CPU seconds its threads spent writing them into memfds (the
        # hand-off's own cost, which fresh memory makes dear: api.md).
        self.handoff_cpu = 0.0

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
            self._timeout_s = float(info.get("timeout_s") or 0)  # 0: an owner that takes no liveness reports

    def _start_saying_alive(self):
        """From the first batch on, a thread tells the group's owner every
        third of its --group-timeout that this job lives (POST
        .../jobs/{j}/alive): a pause between epochs (a validation pass) longer
        than the timeout, which every job takes at about the same time, would
        otherwise detach them all for good. A stopped or killed process says
        nothing and is detached as before; a job W batches behind, by the
        window. The thread holds the loader weakly and ends with close()."""
        if self._alive is not None or not self._timeout_s or self.alone:
            return
        self._alive = threading.Event()
        threading.Thread(target=_say_alive, args=(weakref.ref(self), self._alive, self._timeout_s / 3),
                         name="stallfree-group-alive", daemon=True).start()

    def _say_alive_once(self):
        """One liveness report; False once there is no point in more (this
        job detached, or an owner without the route)."""
        try:
            self._request("POST", f"{self._gpath}/jobs/{self.job}/alive", None, self.wait)
        except _Answer as a:
            if a.status == 410:
                self.alone = True
            return a.status not in (404, 405, 410)
        return True

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
        order = self._order(epoch)
        got = order[b * self.batch_size:(b + 1) * self.batch_size]
        return got.tolist() if np is not None else got

    def _order(self, epoch):
        """epoch_order for epoch, drawn once: a permutation of the whole
        dataset costs O(samples) (most of a CPU second for ImageNet's 1.28M:
        BENCHMARKS.md), and a batch wants its slice once or twice. Kept as
        int64: a quarter of a list's memory."""
        epoch = int(epoch)
        with self._drawing:  # not self._lock: the counters and producer_of need not wait for a draw
            order = self._orders.get(epoch)
            if order is None:
                order = epoch_order(self.seed, epoch, self.samples)
                order = self._orders[epoch] = np.asarray(order, dtype=np.int64) if np is not None else order
                # Two: the last batches of an epoch left early may still be
                # in the I/O threads when the next one starts.
                while len(self._orders) > 2:
                    del self._orders[next(iter(self._orders))]
            return order

    def state_dict(self):
        """Where this job is: enough to resume after the last batch yielded."""
        return {"group": self.group, "job": self.job, "epoch": self.epoch, "batch": self._next, "alone": self.alone}

    def load_state_dict(self, state):
        if state["group"] != self.group or state["job"] != self.job:
            raise ValueError(f"state of job {state['job']} of group {state['group']!r}, not job {self.job} of {self.group!r}")
        self.epoch, self._start, self._next = int(state["epoch"]), int(state["batch"]), int(state["batch"])
        self.alone = self.alone or bool(state.get("alone"))

    def _full(self):
        """Whether every item of the prep stage is written (in some node's
        memory now), as the derived dataset counts it cluster-wide."""
        try:
            info = self.client.dataset(self.stage.name)
        except (StallfreeError, OSError):
            return False
        return int(info.get("written") or 0) >= int(info.get("items") or self.samples)

    def __iter__(self):
        epoch, start = self.epoch, self._start
        self._start = 0
        if self.stage is not None and not self._cache_route and self._full():
            self._cache_route = True
        self.route = "prep-cache" if self._cache_route else "staging"
        self._ensure_pools()
        # Batches in flight (asked for, or being prepared here): half the
        # window. The group prepares about that many batches at once, and
        # the other half is slack for jobs drifting apart, so read-ahead
        # alone does not put a job more than W batches ahead of another.
        depth = max(1, self.window // 2)
        if self._cache_route:
            # Nothing to wait for but this job's own reads: two ahead keep it busy.
            depth = min(depth, 2)
        pending = collections.deque()
        nxt = start
        try:
            for k in range(start, self.batches):
                while nxt < self.batches and len(pending) < depth:
                    pending.append(self._io.submit(self._batch, epoch, nxt, self._cache_route))
                    nxt += 1
                batch = pending.popleft().result()
                self._next = k + 1
                yield batch
        finally:
            for f in pending:
                f.cancel()
        # A finished pass moves on, so that iterating again without
        # set_epoch reads the next epoch, not one the group has dropped.
        self.epoch, self._next = epoch + 1, 0

    # -- one batch -------------------------------------------------------------

    def _batch(self, epoch, b, cached):
        """Batch b as the loop gets it (in an I/O thread)."""
        if cached:
            x, y = self._read_cached(epoch, b)
            return self._finish(epoch, b, x, y)
        batch = decode_batch(self._obtain(epoch, b))
        if self.stage is None and self.augment is None:
            return batch
        x, y = batch if self.labels is not None else (batch, None)
        return self._finish(epoch, b, x, y)

    def _read_cached(self, epoch, b):
        """(F's outputs stacked, labels as numpy or None) of batch b, read
        from the prep cache in one batch request straight into one buffer;
        items not written (evicted) are made by the batch's producer
        (_missing_items)."""
        from ._mapped import ItemMapper, read_batch
        from ._rows import _Rows

        idx = self.indices(epoch, b)
        keys = [None] * len(idx) if self.labels is not None and self.labels.needs_keys else None
        rows = _Rows(self._buffers, len(idx), True)
        if self._mapper is False:  # not looked for yet
            self._mapper = ItemMapper.for_client(self.client)
        try:
            # Items of the node on this host are copied from its memory.
            self._mapper = read_batch(self.client, self._mapper, self.stage.name, idx, rows, keys, True)
            x = rows.array()
        except StallfreeError as e:
            if e.status != 404:
                raise
            got = self._missing_items(epoch, b, idx, keys is not None)
            if keys is not None:
                keys[:] = [k for k, _ in got]
                got = [a for _, a in got]
            x = _stack(got)
        y = self.labels.of(idx, keys) if self.labels is not None else None
        return x, y

    #: Seconds, at most, that a job on the prep-cache route waits for a
    #: batch's producer to write the items it found missing (``wait``, if
    #: shorter). Nothing keeps the jobs together on that route, so a job far
    #: ahead of the producer should not wait long.
    producer_patience = 5.0

    def _missing_items(self, epoch, b, idx, keys):
        """F's outputs of batch b (idx) when the prep cache lacks some
        (evicted since the route was taken). The batch's producer computes
        the missing ones and writes them back; the other jobs wait for them,
        so that F still runs once in the group. A job whose wait ran out (the
        producer far behind or gone, or its writes evicted at once) computes
        what it misses itself for the rest of the epoch."""
        p = self.producer_of(epoch, b)
        if self._no_wait_epoch != epoch and not self.alone and p not in (-1, self.job):
            got = self._await_items(idx, keys, time.monotonic() + min(self.wait, self.producer_patience))
            if got is not None:
                return got
            self._no_wait_epoch = epoch
        computed = []
        got = self.stage.get_many(self.client, idx, keys=keys, computed=computed)
        with self._lock:
            self.stage_calls += len(computed)
        return got

    def _await_items(self, idx, keys, deadline):
        """written_many's answer for idx once every item is written, or None
        at the deadline. Each poll asks only for the items still missing."""
        got, todo, pause = [None] * len(idx), list(range(len(idx))), 0.005
        while True:
            part = self.stage.written_many(self.client, [idx[j] for j in todo], keys=keys)
            for j, g in zip(todo, part):
                got[j] = g
            todo = [j for j, g in zip(todo, part) if g is None]
            if not todo:
                return got
            if time.monotonic() >= deadline:
                return None
            time.sleep(pause)
            pause = min(2 * pause, 0.1)

    def _finish(self, epoch, b, x, y):
        """The yielded batch from x (collated, or F's outputs stacked) and y:
        the per-item transform of a prep-stage group, augment, tensors."""
        torch = sys.modules.get("torch")
        if self.stage is not None and self.transform is not None:
            items = list(x)
            with self._lock:
                self.calls += len(items)
            x = self.collate_fn(self._prep.seeded(epoch, b, lambda: [self.transform(a) for a in items]))
        if torch is not None and np is not None and isinstance(x, np.ndarray):
            x = torch.from_numpy(x)
        if self.augment is not None:
            x = self.augment(x, np.asarray(self.indices(epoch, b), dtype=np.int64), epoch=epoch, seed=self.seed)
        if self.labels is None:
            return x
        if torch is not None and np is not None and isinstance(y, np.ndarray):
            y = torch.from_numpy(y)
        return x, y

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
                    return self._stage(epoch, b)
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
                        return self._stage(epoch, b)
                    self._refresh()
                    continue
                # The node says this job prepares it (it took over a detached
                # job's share): its answer counts, whatever this job knew.
                self._refresh()
                return self._stage(epoch, b)

    def _stage(self, epoch, b):
        """Prepares batch b and PUTs it; returns the bytes every job reads for it."""
        # Prepared here, the batch goes from F's outputs straight into the
        # file handed over, and this job reads it back from there as the
        # others do: each array is copied once, not stacked first.
        handoff = self._handoff  # once: another thread may turn it off meanwhile
        direct = handoff and self._pool is None
        data = self._prepare(epoch, b, encoded=not direct)
        fd = None
        if handoff:
            t = time.thread_time()
            fd = _memfd_of(_pieces(data) if direct else [data])
            with self._lock:
                self.handoff_cpu += time.thread_time() - t
        try:
            if direct:
                data = _map_fd(fd)
            return self._stage_from(epoch, b, data, fd)
        finally:
            if fd is not None:
                os.close(fd)  # the node holds its own descriptor once it took the file

    def _stage_from(self, epoch, b, data, fd):
        while True:
            try:
                if fd is not None:
                    try:
                        self._call("PUT", epoch, b, None, self.wait, f"&memfd={fd}&ino={os.fstat(fd).st_ino}")
                        with self._lock:
                            self.handed_over += 1
                        return data
                    except _Answer as a:
                        if a.status != 400 or "memfd" not in a.message:
                            raise
                        # A node that cannot take the file (not the same
                        # user, /proc hidden): send the bytes, from now on.
                        self._handoff, fd = False, None
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

    def _prepare(self, epoch, b, encoded=True):
        """Batch b, made here (encoded, or as its arrays when not encoded; a
        worker process's always encoded)."""
        idx = self.indices(epoch, b)
        with self._lock:
            self.calls += len(idx) if self.transform and self.stage is None else 0
        if self._pool is not None:
            data, computed = self._pool.apply_async(_worker_run, ((epoch, b, idx),)).get()
        else:
            data, computed = self._prep(epoch, b, idx, encoded)
        with self._lock:
            self.stage_calls += computed
        return data

    # -- plumbing -----------------------------------------------------------------

    def _ensure_pools(self):
        if self._pool is None and self.num_workers > 0:
            # Forked before this loader starts any thread of its own, as
            # DataLoader does; the transform need not be picklable.
            ctx = multiprocessing.get_context("fork")
            self._pool = ctx.Pool(self.num_workers, initializer=_worker_init, initargs=(self._prep,))
        if self._buffers is None and np is not None:
            # Buffers for the batches read from the prep cache, and for the
            # batches this process encodes to stage: reused once nothing refers
            # to them (a fresh 10 MB buffer a batch costs more CPU in page
            # faults than filling it).
            self._buffers = _Pool(pinned=False, keep=max(1, self.window // 2) + 4)
            if self._pool is None:
                self._prep.alloc = self._buffers.get
        self._start_saying_alive()  # after the fork above: no worker inherits the thread
        if self._io is None:
            self._io = concurrent.futures.ThreadPoolExecutor(
                max_workers=max(1, self.window // 2) + 1,
                thread_name_prefix="stallfree-group")

    def _conn(self):
        c = getattr(self._local, "conn", None)
        if c is None:
            if self._sock:
                c = _UnixHTTPConnection(self._sock, timeout=self.wait + 60)
            else:
                c = http.client.HTTPConnection(self._host, self._port, timeout=self.wait + 60)
            self._local.conn = c
        return c

    def _call(self, method, epoch, b, body, wait, query=""):
        path = f"{self._gpath}/epochs/{int(epoch)}/batches/{int(b)}?job={self.job}&wait={wait}s{query}"
        if method == "GET" and self._map:
            got = self._request(method, path + "&map=1", body, wait)
            if not isinstance(got, tuple):
                return got
            try:
                return _map_file(*got)
            except PermissionError:
                # Not ours to open (another user's node): read it instead,
                # from now on.
                self._map = False
            except (_Reused, OSError):
                # This job was too slow to open it: the node let the file go
                # (a moment after the batch was dropped by the other jobs'
                # reads) and its descriptor number may name another file by
                # now. Asked again without map, the node sends the bytes if
                # it still has the batch, or answers that it was dropped and
                # this job makes it itself. The next batch is mapped again.
                pass
        return self._request(method, path, body, wait)

    def _request(self, method, path, body, wait):
        """The answer's body (a bytearray), or a mapped batch's (path, inode,
        device; None where the node named none)."""
        h = {"Connection": "keep-alive"}
        if self.token:
            h["Authorization"] = "Bearer " + self.token
        if body is not None:
            h["Content-Type"] = "application/octet-stream"
            if not isinstance(body, (bytes, bytearray)):
                body = memoryview(body).cast("B")  # a reused numpy buffer: http.client tests a body's truth
        for attempt in range(5):
            c = self._conn()
            try:
                c.request(method, path, body=body, headers=h)
                r = c.getresponse()
                if r.status == 200 and r.getheader("X-Group-Map"):
                    r.read()
                    ino, dev = (r.getheader(h) for h in ("X-Group-Map-Ino", "X-Group-Map-Dev"))
                    return (r.getheader("X-Group-Map"), int(ino) if ino and ino.isdigit() else None,
                            int(dev) if dev and dev.isdigit() else None)
                if r.status == 200 and r.length is not None:
                    # Read into a buffer of our own: the arrays decoded from
                    # it are writable views, not copies.
                    size = r.length
                    data = bytearray(size)
                    got = r.readinto(data) if size else 0
                    if got != size:
                        raise http.client.IncompleteRead(bytes(data[:got]), size - got)
                else:
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
        if self._alive is not None:
            self._alive.set()
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
