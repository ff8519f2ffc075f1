"""Copying a batch's items from the item cache of the node on this host,
mapped read-only, instead of receiving them through a socket (docs/device.md,
"Items from the node's memory").

The node answers ``POST /v1/datasets/{name}/batch?map=1`` over its Unix
socket with where each item lies in its arena (a memfd) and the sum of the
generations of the item's pages. The loader copies each item into its row of
the batch buffer (one copy of each byte, none by the kernel), then sums the
generations again: the node bumps a page's generation whenever an item on it
is freed, before its bytes can be reused, so an equal sum means the copied
bytes are the item's. An item whose sum moved, or that is not resident on this
node, is read through a plain batch request. The check relies on x86-64's
memory ordering (loads are not reordered with older loads), so this path is
taken only there.
"""

import http.client
import json
import mmap
import os
import platform
import sys
import threading
import warnings

import msgpack
import numpy as np

from .client import StallfreeError, _socket_path, _UnixHTTPConnection
from .prep import MAGIC, _HEAD

#: Machines whose memory ordering the generation check relies on.
_ORDERED = {"x86_64", "AMD64", "i686", "i386"}


def map_readonly(path, size=None, ident=None):
    """A file of the node's (its item arena, a checkpoint part), mapped
    read-only and shared: ``size`` bytes, or the whole file. ``ident``, the
    (device, inode) the node named, must be the opened file's. OSError when
    it cannot be opened or mapped, ValueError when it is not ``size`` bytes
    or not that file."""
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if ident is not None and (st.st_dev, st.st_ino) != tuple(ident):
            raise ValueError(f"{path}: device {st.st_dev} inode {st.st_ino}, not the node's {ident}")
        have = st.st_size
        if size is not None and have != size:
            raise ValueError(f"{path}: {have} bytes, not {size}")
        return mmap.mmap(fd, have if size is None else size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    finally:
        os.close(fd)  # the mapping stays


class _Mapping:
    """The arena and generations of one node process, mapped read-only."""

    def __init__(self, arena, gens, size):
        self.ident = (_ident(arena), _ident(gens))
        self.arena = map_readonly(arena)
        if len(self.arena) < size:
            raise OSError(f"{arena}: {len(self.arena)} bytes, not {size}")
        self.gens_map = map_readonly(gens)
        self.view = memoryview(self.arena)
        self._tensor = None
        self.gens = np.frombuffer(self.gens_map, dtype="<u4")

    def tensor(self):
        """The arena as a read-only uint8 torch tensor (made once)."""
        if self._tensor is None:
            import torch

            with warnings.catch_warnings():  # read-only: nothing writes through it
                warnings.simplefilter("ignore", UserWarning)
                self._tensor = torch.from_numpy(np.frombuffer(self.arena, dtype=np.uint8))
        return self._tensor

    def gen_sum(self, off, size, page):
        if size == 0:
            return 0
        return int(self.gens[off // page:(off + size - 1) // page + 1].sum(dtype=np.uint64))


def _ident(path):
    st = os.stat(path)
    return st.st_dev, st.st_ino


class ItemMapper:
    """Reads batches from the mapped item cache of the node ``client`` talks
    to first, when it is on this host (its Unix socket). ``read`` returns the
    positions it could not place; ``None`` from ``for_client`` means there
    is no such node (or this machine is not one the check holds on)."""

    def __init__(self, client, sock):
        self.client, self.sock = client, sock
        self._local, self._pid = threading.local(), os.getpid()
        self._lock = threading.Lock()
        self._map = None
        self.copied = self.fallbacks = 0  # items copied from the mapping; items read otherwise

    @classmethod
    def for_client(cls, client):
        if platform.machine() not in _ORDERED or not client.urls:
            return None
        base = client.urls[0]
        sock = _socket_path(base) or client._socket_of(base)
        return cls(client, sock) if sock else None

    def _conn(self):
        if self._pid != os.getpid():  # forked: the parent's connections are not ours
            self._local, self._pid = threading.local(), os.getpid()
        c = getattr(self._local, "conn", None)
        if c is None:
            c = self._local.conn = _UnixHTTPConnection(self.sock, self.client.timeout)
        return c

    def _locate(self, name, indices):
        """The node's answer, or None when it has nothing to map (204)."""
        h = {"Content-Type": "application/json"}
        if self.client.token:
            h["Authorization"] = "Bearer " + self.client.token
        body = json.dumps({"indices": [int(i) for i in indices]})
        c = self._conn()
        try:
            c.request("POST", f"/v1/datasets/{self.client._q(name)}/batch?map=1", body=body, headers=h)
            r = c.getresponse()
            data = r.read()
        except (OSError, http.client.HTTPException):  # the node gone mid-answer too: the next ask reconnects
            c.close()
            raise
        if r.status == 204:
            return None
        if r.status != 200:
            raise StallfreeError(r.status, data.decode(errors="replace"))
        return msgpack.unpackb(data, raw=False)

    def _mapping(self, ans):
        with self._lock:
            m = self._map
            try:
                if m is None or m.ident != (_ident(ans["arena"]), _ident(ans["gens"])):
                    m = self._map = _Mapping(ans["arena"], ans["gens"], ans["size"])
            except OSError:
                return None  # not ours to open (another user's node, another container)
            return m

    def _located(self, name, indices):
        """(the node's answer for indices, the mapping it names), or None
        when the node has nothing to map or the mapping cannot be opened."""
        ans = self._locate(name, indices)
        if ans is None:
            return None
        m = self._mapping(ans)
        return None if m is None else (ans, m)

    def read(self, name, indices, rows, keys, prep):
        """Copies the items of ``indices`` resident on the node into their
        rows of ``rows`` (a ``_Rows``), their keys into ``keys`` when given;
        returns the positions left to read otherwise, or None when nothing
        can be mapped."""
        found = self._located(name, indices)
        if found is None:
            return None
        ans, m = found
        page = ans["page"]
        left, placed = [], []
        for p, it in enumerate(ans["items"]):
            if it is None:
                left.append(p)
                continue
            off, size, gens, key = it
            try:
                start = _payload(rows, m, off, size, prep, lambda: m.gen_sum(off, size, page) == gens)
            except ValueError:
                if m.gen_sum(off, size, page) == gens:
                    raise  # the item's own bytes: a real error
                left.append(p)  # reused while read: garbage, read it again
                continue
            placed.append((p, off, size, gens, key, start))
        _copy(rows, m, [(p, start, off + size) for p, off, size, _, _, start in placed])
        for p, off, size, gens, key, _ in placed:
            if m.gen_sum(off, size, page) != gens:
                left.append(p)
            elif keys is not None:
                keys[p] = key
        self.copied += len(indices) - len(left)
        self.fallbacks += len(left)
        return sorted(left)

    def read_items(self, name, indices, alloc=None):
        """Each item of ``indices`` as a ``(key, bytes)`` pair copied out of
        the node's memory, or None where it must be read otherwise (not
        resident on this node, or its pages' generations moved while it was
        copied); None when nothing can be mapped. For items of any size
        (``CachedDataset``); ``read`` fills a batch's rows instead.

        With ``alloc(nbytes)`` (a uint8 numpy array), the items are copied
        one after the other into one buffer from it and come back as uint8
        views of it: a batch of JPEGs for ``decode="jpeg"`` without a fresh
        allocation per item (a bytes object and a bytearray made of it cost
        55 page faults a sample on the H200's VM, 0.33 CPU ms a sample in
        the training process). With torch, that copy is one call that lets
        go of the GIL."""
        found = self._located(name, indices)
        if found is None:
            return None
        ans, m = found
        page, placed, total = ans["page"], [], 0
        for p, it in enumerate(ans["items"]):
            if it is not None:
                placed.append((p, it, total))
                total += it[1]
        mem = _packed(m, placed, alloc(total)[:total]) if alloc is not None and placed else None
        out = [None] * len(indices)
        for p, (off, size, gens, key), at in placed:
            data = bytes(m.view[off:off + size]) if mem is None else mem[at:at + size]
            if m.gen_sum(off, size, page) == gens:  # else reused while copied: read it again
                out[p] = (key, data)
        left = out.count(None)
        self.copied += len(out) - left
        self.fallbacks += left
        return out


def _packed(m, placed, mem):
    """Copies each placed item (position, (off, size, ...), at) of mapping
    m to mem[at:at + size]; returns mem."""
    torch = sys.modules.get("torch")
    if torch is None:
        for _, (off, size, _, _), at in placed:
            mem[at:at + size] = m.view[off:off + size]
    else:
        torch.cat([m.tensor()[off:off + size] for _, (off, size, _, _), _ in placed], out=torch.from_numpy(mem))
    return mem


def _copy(rows, m, spans):
    """Copies each (row, start, stop) span of mapping m into its row.

    With torch loaded (DeviceLoader), each run of consecutive rows is one
    ``torch.cat`` into the buffer: one call that lets go of the GIL for the
    whole copy. A memoryview's slice assignment holds the GIL for every
    byte, a batch's 50 MB for milliseconds that the training loop's thread,
    which lets go of it and takes it back at every kernel launch, then
    waits; a copy per item that lets go of it (numpy's) takes it back 256
    times, each time behind the loop's thread. Without torch, the items are
    copied as before, under the GIL."""
    if not spans:  # nothing mapped: the batch's buffer may not be set up
        return
    torch = sys.modules.get("torch")
    if torch is None:
        for p, start, stop in spans:
            rows.row(p)[:] = m.view[start:stop]
        return
    arena, buf, i = m.tensor(), torch.from_numpy(rows.mem), 0
    while i < len(spans):
        j = i + 1
        while j < len(spans) and spans[j][0] == spans[j - 1][0] + 1:
            j += 1
        first = spans[i][0]
        torch.cat([arena[start:stop] for _, start, stop in spans[i:j]],
                  out=buf[first * rows.nbytes:(first + j - i) * rows.nbytes])
        i = j


def _payload(rows, m, off, size, prep, stable):
    """Where the payload of the item at off:off+size of mapping m starts,
    once its layout is checked against the batch's; a prep header that
    would set the batch's layout is taken only once ``stable()`` says the
    bytes read so far were the item's."""
    view = m.view
    if not prep:
        if rows.mem is None:
            rows.setup(None, np.uint8, (size,))
        if size != rows.nbytes:
            raise ValueError(f"DeviceLoader: raw items differ in size ({size} and {rows.nbytes} bytes); "
                             "use a prep stage (cache_stage) or decode='jpeg'")
        return off
    if size < _HEAD.size:
        raise ValueError("prep cache: not an encoded array (too short)")
    magic, hlen = _HEAD.unpack(view[off:off + _HEAD.size])
    if magic != MAGIC or _HEAD.size + hlen > size:
        raise ValueError("prep cache: not an encoded array (wrong magic or header length)")
    head = bytes(view[off + _HEAD.size:off + _HEAD.size + hlen])
    if head != rows.head:
        if not stable():
            raise ValueError("prep cache: the item moved while its header was read")
        rows.layout(head)
    start = off + _HEAD.size + hlen
    if off + size - start != rows.nbytes:
        raise ValueError("prep cache: an item's bytes do not match its header")
    return start


def read_batch(client, mapper, name, indices, rows, keys, prep):
    """Fills ``rows`` with the items of ``indices`` of dataset ``name``: those
    ``mapper`` (an ItemMapper, or None) copies from the node's memory, the
    rest through ``client``'s batch request (a StallfreeError such as 404
    "not written" propagates). Returns the mapper to use for the next batch:
    None once the node has nothing to map."""
    todo = None  # positions of indices still to read
    if mapper is not None:
        try:
            todo = mapper.read(name, indices, rows, keys, prep)
        except (OSError, http.client.HTTPException):
            todo = None  # the socket is an optimisation
        if todo is None:
            mapper = None
        elif not todo:
            return mapper
    if todo is None:
        client.batch_into(name, indices, lambda r, pos: rows.read(r, pos, keys))
    else:
        client.batch_into(name, [indices[p] for p in todo], lambda r, pos: rows.read(r, [todo[q] for q in pos], keys))
    return mapper
