"""Prep cache: run the deterministic part of prep once per item per cluster.

``CachedDataset(url, ds, transform=T, cache_stage=("decoded-224-v1", F))``
keeps F's output for every item in the cluster's memory, in a *derived
dataset* (``PUT /v1/datasets/{name} {"derived_from", "stage"}``, docs/api.md
"Prep cache"). The first time anyone in the cluster reads item i, F runs on
the parent's item and its output is written back; from then on every reader,
in any process on any node, gets F's output and runs only T (the random
augmentation).

F must be deterministic and return a numpy array or a torch tensor; it is
stored as a small self-describing header (kind, dtype, shape) and the raw
bytes, and comes back with the same dtype, shape and bytes. Changing the
stage string starts a fresh cache (another derived dataset).
"""

import hashlib
import json
import re
import struct

import msgpack

from ._pool import REUSE_FROM, _ProcessPool
from .client import StallfreeError

try:
    import numpy as np
except ImportError:  # pragma: no cover - numpy is needed only to decode arrays
    np = None

MAGIC = b"SFPC"
_HEAD = struct.Struct("<4sI")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def derived_name(parent, stage):
    """The derived dataset that caches ``stage`` of ``parent``: readable when
    the stage is a plain name, a hash of it otherwise."""
    name = f"{parent}.{stage}"
    if _NAME.fullmatch(name):
        return name
    return f"{parent[:100]}.{hashlib.sha256(stage.encode()).hexdigest()[:16]}"


def encode(value, alloc=None):
    """A numpy array or torch tensor as header + raw bytes (C order), in a
    bytearray written once: the array's bytes are copied into it, not
    gathered first (``tobytes``) and joined after. With ``alloc(n)`` (a
    writable uint8 numpy array of n bytes, e.g. from a pool of reused
    buffers), written into that array instead, which is returned."""
    if np is not None and isinstance(value, np.ndarray):
        if value.dtype.hasobject:
            raise TypeError("cache_stage: an array of Python objects cannot be cached; return numbers")
        arr = np.ascontiguousarray(value)
        head = {"kind": "numpy", "dtype": arr.dtype.str, "shape": list(arr.shape)}
        flat = arr.reshape(-1).view(np.uint8)
    elif type(value).__module__.startswith("torch") and hasattr(value, "dtype") and hasattr(value, "shape"):
        import torch

        t = value.detach().cpu().contiguous()
        head = {"kind": "torch", "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
        # Through a byte view: every torch dtype (bfloat16 too) has one.
        flat = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
    else:
        raise TypeError(f"cache_stage: the function must return a numpy array or a torch tensor, not {type(value).__name__}")
    h = json.dumps(head, separators=(",", ":")).encode()
    start = _HEAD.size + len(h)
    out = bytearray(start + len(flat)) if alloc is None else alloc(start + len(flat))
    view = memoryview(out)
    _HEAD.pack_into(view, 0, MAGIC, len(h))
    view[_HEAD.size:start] = h
    view[start:] = flat
    return out


def decode(data, copy=True):
    """What ``encode`` made, back: same kind, dtype, shape and bytes. The
    result is writable (T may modify it in place): a copy of data's bytes,
    or with copy=False a view of data itself, which must then be a
    bytearray or a writable numpy array the caller hands over."""
    if len(data) < _HEAD.size:
        raise ValueError("prep cache: item too short for its header")
    magic, n = _HEAD.unpack_from(data)
    if magic != MAGIC or _HEAD.size + n > len(data):
        raise ValueError("prep cache: not an encoded array (wrong magic or header length)")
    head = json.loads(bytes(data[_HEAD.size:_HEAD.size + n]))
    start, shape = _HEAD.size + n, tuple(head["shape"])
    if head["kind"] == "torch":
        import torch

        dtype = getattr(torch, head["dtype"])
        raw = _payload(data, start, torch.empty((), dtype=dtype).element_size(), copy)
        if not len(raw):
            return torch.empty(shape, dtype=dtype)
        return torch.frombuffer(raw, dtype=torch.uint8).view(dtype).reshape(shape)
    dtype = np.dtype(head["dtype"])
    return np.frombuffer(_payload(data, start, dtype.itemsize, copy), dtype=dtype).reshape(shape)


def _payload(data, start, itemsize, copy):
    """data's bytes from start, writable: a copy, or with copy=False a view
    of data (a bytearray or a writable numpy array) when its first element
    is aligned for its dtype. The header's length makes the offset
    arbitrary, and numpy and torch work on a misaligned array, slower."""
    owned = isinstance(data, bytearray) or (np is not None and isinstance(data, np.ndarray) and data.flags.writeable)
    if copy or not owned or start % max(itemsize, 1):
        return bytearray(memoryview(data)[start:])  # copied once
    return memoryview(data)[start:]


class DecodeResize:
    """A prep stage F for images: decode, resize the shorter side to ``side``
    and crop the centre square, as an HWC uint8 array (side, side, 3). Use it
    as ``cache_stage=(f"rgb-{side}-v1", DecodeResize(side))``.

    It costs less than writing the same steps out with Pillow: only the
    square that is kept is resized (``resize(box=...)``; resizing the whole
    image then cropping filters a third more pixels for a 4:3 photo), and a
    JPEG at least twice the size needed is decoded at a reduced scale
    (``draft``: the DCT does the first halvings). Deterministic: the same
    bytes give the same array. Needs Pillow and numpy. Picklable, so
    DataLoader workers get it with the dataset."""

    def __init__(self, side=256):
        if not isinstance(side, int) or side < 1:
            raise ValueError(f"DecodeResize: side must be a positive int, not {side!r}")
        self.side = side

    def __call__(self, raw):
        from PIL import Image

        import io

        im = Image.open(io.BytesIO(raw))
        if im.format == "JPEG":
            # The smallest DCT scale that keeps both sides at least `side`:
            # a whole halving is exact enough, and the resize below does the
            # rest.
            w, h = im.size
            m = min(w, h)
            im.draft("RGB", (-(-w * self.side // m), -(-h * self.side // m)))
        if im.mode != "RGB":
            im = im.convert("RGB")
        w, h = im.size
        m = min(w, h)
        left, top = (w - m) / 2, (h - m) / 2
        out = im.resize((self.side, self.side), Image.BILINEAR, box=(left, top, left + m, top + m))
        return np.asarray(out, dtype=np.uint8)

    def __repr__(self):
        return f"DecodeResize({self.side})"


def _chunks(pairs, limit):
    """[(index, bytes)] in runs of at most ``limit`` bytes (an item larger
    than that alone): a node takes a batch write of up to 256 MiB, and
    refuses a larger one before its body is read, which the sender sees as
    a broken connection, not as a 413."""
    run, size = [], 0
    for pair in pairs:
        if run and size + len(pair[1]) > limit:
            yield run
            run, size = [], 0
        run.append(pair)
        size += len(pair[1])
    if run:
        yield run


def _big(value):
    """Whether value's bytes are worth a reused buffer (REUSE_FROM)."""
    n = getattr(value, "nbytes", None)
    if n is None and hasattr(value, "element_size"):
        n = value.element_size() * value.numel()
    return (n or 0) >= REUSE_FROM


class PrepStage:
    """One prep stage of one parent dataset, cached in the cluster.

    Holds no connection: every call is given the caller's client, so one
    stage object serves every DataLoader worker (it is pickled with the
    dataset). ``get(client, i)`` and ``get_many(client, indices)`` return F's
    output for the items (the per-batch hook for batch loaders); the caller
    applies its transform.
    """

    def __init__(self, client, parent, stage, fn, tar=False):
        if not isinstance(stage, str) or not stage:
            raise ValueError("cache_stage: want (stage string, function)")
        if not callable(fn):
            raise TypeError("cache_stage: the second element must be a function")
        self.parent, self.stage, self.fn, self.tar = parent, stage, fn, tar
        self.name = derived_name(parent, stage)
        self._batch_writes = True  # until a node answers 405 (one without PUT …/batch)
        # Buffers for F's encoded results, of each process its own. keep: the
        # free ones are forgotten only past this many in all, more than a
        # batch's items.
        self._pool = _ProcessPool(keep=4096)
        # Idempotent: the same body from any process answers 200 with the
        # dataset as it is.
        client.json("PUT", f"/v1/datasets/{client._q(self.name)}", {"derived_from": parent, "stage": stage})

    def _made(self, raw):
        """F's encoded output for the item raw."""
        return self._encoded(self.fn(raw))

    def _encoded(self, value):
        """encode(value), into a buffer reused once nothing refers to it (F's
        result, handed to T, lives until T is done with it). A fresh
        bytearray an item was freed with its batch, trimmed back to the
        kernel by glibc, and faulted in again by the next batch: ~50 page
        faults a 192 KiB item."""
        if np is None or not _big(value):
            return encode(value)
        return encode(value, self._pool.get)

    def _path(self, client, i):
        return f"/v1/datasets/{client._q(self.name)}/index/{int(i)}"

    def _cached(self, client, i):
        """The decoded item, or None when nobody has written it."""
        try:
            return decode(client.index(self.name, i))
        except StallfreeError as e:
            if e.status == 404:
                return None
            raise

    def _cached_keyed(self, client, i):
        """(key, decoded item), or None when nobody has written it. Through
        the client's node (the key is in the X-Key header), not the owner."""
        try:
            r, data = client.request("GET", self._path(client, i))
        except StallfreeError as e:
            if e.status == 404:
                return None
            raise
        return r.getheader("X-Key"), decode(data)

    def _parent(self, client, indices):
        """[(key, raw item or sample dict)] of the parent's indices."""
        if self.tar:
            return [(s["__key__"], s) for s in client.samples(self.parent, indices)]
        return client.batch(self.parent, indices)

    def _compute(self, client, i, raw):
        """Runs F (its exceptions are the caller's) and writes the result
        back; another writer's result, when it was first, is what counts."""
        return self._written(client, i, self._made(raw))

    def _written(self, client, i, data):
        """Writes F's encoded result for item i and returns what readers get."""
        # A pooled buffer is a numpy array: http.client tests a body's truth,
        # which an array of more than one element has none of.
        body = data if isinstance(data, (bytes, bytearray)) else memoryview(data).cast("B")
        try:
            client.request("PUT", self._path(client, i), body, {"Content-Type": "application/octet-stream"})
        except StallfreeError as e:
            if e.status == 409:  # another process wrote first: read what is there
                got = self._cached(client, i)
                if got is not None:
                    return got
            elif e.status not in (413, 503, 507):  # not kept: still a valid result
                raise
        return decode(data, copy=False)  # what a later read returns, exactly (data is this call's own)

    def get(self, client, i):
        """F's output for item i."""
        got = self._cached(client, i)
        if got is not None:
            return got
        return self._compute(client, i, self._parent(client, [int(i)])[0][1])

    def get_many(self, client, indices, keys=False, computed=None, parent=None, executor=None):
        """F's output for several items (with keys=True, as (key, output)
        pairs): one batch request when all are written (every epoch after
        the first), else each one that is written, then the parent's bytes
        of the rest in one request, or with ``parent(indices)`` (``[(key,
        bytes)]``) as it reads them (``CachedDataset``: copied out of the
        mapped memory of the node on this host). ``computed``, a list, gets
        the positions (in indices) of the items F ran on here. F runs on
        the items one after the other, or with ``executor`` (a
        ``concurrent.futures`` executor of threads) side by side in it;
        still one after the other for a single item, and against a node
        without batch writes (each item is then written on its own)."""
        indices = [int(i) for i in indices]
        if not indices:
            return []
        # Only the items not written yet are computed.
        out = self.written_many(client, indices, keys)
        missing = [j for j, v in enumerate(out) if v is None]
        if missing:
            todo = [indices[j] for j in missing]
            raws = self._parent(client, todo) if parent is None else parent(todo)
            values = self._compute_many(client, todo, [raw for _, raw in raws], executor)
            for j, (key, _), value in zip(missing, raws, values):
                if computed is not None:
                    computed.append(j)
                out[j] = (key, value) if keys else value
        return out

    def written_many(self, client, indices, keys=False):
        """F's output (with keys=True, (key, output)) of each of indices
        that is written, None for the others: one request."""
        indices = [int(i) for i in indices]
        if not indices:
            return []
        _, data = client.request("POST", f"/v1/datasets/{client._q(self.name)}/batch?partial=1", {"indices": indices})
        got = msgpack.unpackb(data, raw=False)
        if len(got) != len(indices):
            raise StallfreeError(502, f"prep cache {self.name}: {len(got)} items answered for {len(indices)}")
        return [None if g is None else ((g["key"], decode(g["data"])) if keys else decode(g["data"])) for g in got]

    #: The most bytes of F's results one batch write carries (the node's
    #: limit is 256 MiB).
    max_write_bytes = 64 << 20

    def _compute_many(self, client, indices, raws, executor=None):
        """Runs F on each item (in executor, when given) and writes the
        results back in one request; as _compute, another writer's result,
        when it was first, is what counts. Against a node without batch
        writes (405), one by one."""
        if len(indices) == 1 or not self._batch_writes:
            return [self._compute(client, i, raw) for i, raw in zip(indices, raws)]
        made = (executor.map if executor is not None else map)(self._made, raws)
        data = list(made)
        try:
            results = []
            for part in _chunks(list(zip(indices, data)), self.max_write_bytes):
                results.extend(client.put_items(self.name, part))
        except StallfreeError as e:
            if e.status not in (405, 413):
                raise
            if e.status == 405:
                self._batch_writes = False  # an older node: write one by one from now on
            # 413: the batch is over the node's limit; each item on its own may not be.
            return [self._written(client, i, d) for i, d in zip(indices, data)]
        out = []
        for i, d, res in zip(indices, data, results):
            status = int(res.get("status", 0))
            if status == 409:  # another process wrote first: read what is there
                got = self._cached(client, i)
                if got is not None:
                    out.append(got)
                    continue
            elif status not in (200, 201, 413, 503, 507):  # those leave a valid result uncached
                raise StallfreeError(status, f"prep cache {self.name} item {i}: {res.get('error', '')}")
            out.append(decode(d, copy=False))
        return out
