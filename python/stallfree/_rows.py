"""Reading a node's batch answer of fixed-shape items straight into one
contiguous buffer (no Python object per item): the parser reads each item's
framing and hands the payload's row to the socket's ``readinto``. Used by
``stallfree.torch.DeviceLoader`` and by ``CoordinatedLoader``'s prep-cache
route; needs numpy, and torch only for torch-kind items, tensors and pinned
buffers (imported when used).
"""

import json
import struct
import sys
import threading

import numpy as np

from ._pool import _Buffer, _Pool  # noqa: F401 - imported from here by the loaders
from .prep import MAGIC, _HEAD

_PEEK = 512  # bytes of framing looked at at once: a key up to ~400 bytes and a prep header

_LEN = {0xd9: ">B", 0xda: ">H", 0xdb: ">I", 0xc4: ">B", 0xc5: ">H", 0xc6: ">I", 0xdc: ">H", 0xdd: ">I",
        0xde: ">H", 0xdf: ">I"}


class _Stream:
    """Reads msgpack framing from an HTTP response body, piece by piece.

    A body of known length is read from the response's buffered socket file
    directly (C calls: a few per item instead of http.client's Python-level
    ``read`` bookkeeping), and the response is closed once every byte is
    read, as http.client would, so that the connection is used again."""

    def __init__(self, r):
        self.r = r
        self.direct = not r.chunked and r.length is not None
        self.f = r.fp if self.direct else r
        self.left = r.length if self.direct else None

    def exact(self, n):
        b = self.f.read(n)
        if len(b) != n:
            raise ConnectionError(f"batch answer cut off ({len(b)} of {n} bytes)")
        if self.direct:
            self.left -= n
        return b

    def into(self, view):
        n = self.f.readinto(view)
        if n != len(view):
            raise ConnectionError(f"batch answer cut off ({n} of {len(view)} bytes)")
        if self.direct:
            self.left -= n

    def done(self):
        """Checks the body was read to its end and releases the response."""
        if self.direct:
            if self.left != 0:
                raise ValueError(f"batch answer: {self.left} bytes past its items")
            self.r.length = 0
            self.r.close()
        elif self.r.read(1):
            raise ValueError("batch answer: bytes past its items")

    def framing(self, prep):
        """(key, payload size, prep header or None) of the next item, its
        framing consumed, when it has the node's layout (``{"key": str,
        "data": bin}``, as writeBatch writes it) and is already in the read
        buffer: one look at the buffer instead of a read per field. None,
        with nothing consumed, otherwise."""
        if not self.direct:
            return None
        buf = self.f.peek(_PEEK)
        try:
            if buf[:5] != b"\x82\xa3key":
                return None
            t, i = buf[5], 6
            if 0xa0 <= t <= 0xbf:
                n = t - 0xa0
            elif t == 0xd9:
                n, i = buf[6], 7
            else:
                return None
            key, i = buf[i:i + n], i + n
            if buf[i:i + 5] != b"\xa4data":
                return None
            t, i = buf[i + 5], i + 6
            if t not in (0xc4, 0xc5, 0xc6):
                return None
            w = {0xc4: 1, 0xc5: 2, 0xc6: 4}[t]
            size, i = int.from_bytes(buf[i:i + w], "big"), i + w
            head = None
            if prep:
                magic, hlen = _HEAD.unpack_from(buf, i)
                if magic != MAGIC or _HEAD.size + hlen > size:
                    raise ValueError("prep cache: not an encoded array (wrong magic or header length)")
                head, i = buf[i + _HEAD.size:i + _HEAD.size + hlen], i + _HEAD.size + hlen
        except (IndexError, struct.error):  # the framing runs past what is buffered
            return None
        if i > len(buf) or len(key) != n:
            return None
        self.exact(i)
        return key, size, head

    def _len(self, tag):
        fmt = _LEN[tag]
        return struct.unpack(fmt, self.exact(struct.calcsize(fmt)))[0]

    def header(self, fix_lo, fix_hi, wide, what):
        """The length in a fix* or wide header (wide: its tag bytes)."""
        tag = self.exact(1)[0]
        if fix_lo <= tag <= fix_hi:
            return tag - fix_lo
        if tag in wide:
            return self._len(tag)
        raise ValueError(f"batch answer: expected {what}, got msgpack tag {tag:#x}")

    def array(self):
        return self.header(0x90, 0x9f, (0xdc, 0xdd), "an array")

    def map(self):
        return self.header(0x80, 0x8f, (0xde, 0xdf), "a map")

    def str(self):
        return self.exact(self.header(0xa0, 0xbf, (0xd9, 0xda, 0xdb), "a string"))

    def bin(self):
        tag = self.exact(1)[0]
        if tag not in (0xc4, 0xc5, 0xc6):
            raise ValueError(f"batch answer: expected bytes, got msgpack tag {tag:#x}")
        return self._len(tag)


class _Rows:
    """The host buffer one batch is read into: ``n`` rows of one item
    each, its dtype and shape set by the first item that arrives (from any
    owner's part: parts are read in parallel)."""

    def __init__(self, pool, n, prep):
        self.pool, self.n, self.prep = pool, n, prep
        self.lock = threading.Lock()
        self.mem = None  # a view of the pool's buffer (holding it in use)
        self.head = None  # the prep header every item must repeat
        self.dtype, self.shape, self.nbytes = None, None, None

    def setup(self, head, dtype, shape):
        """Sets (first item) or checks (every other) the items' layout."""
        with self.lock:
            if self.mem is None:
                self.head, self.dtype, self.shape = head, np.dtype(dtype), tuple(shape)
                self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
                self.mem = self.pool.get(self.n * self.nbytes)
            elif (np.dtype(dtype), tuple(shape)) != (self.dtype, self.shape):
                raise ValueError(f"DeviceLoader: items of one batch differ in layout: {self.dtype}{list(self.shape)} "
                                 f"and {np.dtype(dtype)}{list(shape)} (decode='jpeg' takes variable sizes)")

    def layout(self, head):
        """Sets or checks the layout a prep header gives (parsed once per
        batch, compared as bytes after that)."""
        if head == self.head:
            return
        try:
            h = json.loads(head)
            dtype = h["dtype"] if h["kind"] == "numpy" else _torch_numpy_dtype(h["dtype"])
            shape = h["shape"]
        except (KeyError, TypeError) as e:
            raise ValueError(f"prep cache: a bad array header ({e})") from e
        self.setup(head, dtype, shape)

    def row(self, p):
        """A writable view of row p's bytes."""
        return memoryview(self.mem)[p * self.nbytes:(p + 1) * self.nbytes]

    def array(self):
        """The batch as a (n, *shape) numpy array over the buffer."""
        return self.mem.view(self.dtype).reshape((self.n,) + self.shape)

    def tensor(self):
        """The batch as a (n, *shape) tensor over the buffer."""
        import torch

        return torch.from_numpy(self.array())

    def read(self, r, positions, keys):
        """The sink of ``Client.batch_into``: one answer's items into their rows."""
        s = _Stream(r)
        if s.array() != len(positions):
            raise ValueError("batch answer: wrong number of items")
        for p in positions:
            framed = s.framing(self.prep)
            if framed is None:
                self._item(s, p, keys)
                continue
            key, size, head = framed
            if keys is not None:
                keys[p] = key.decode()
            self._place(s, p, size, head)
        s.done()
        return True

    def _item(self, s, p, keys):
        """One item's map, field by field (any msgpack framing)."""
        for _ in range(s.map()):
            name = s.str()
            if name == b"key":
                k = s.str()
                if keys is not None:
                    keys[p] = k.decode()
            elif name == b"data":
                size = s.bin()
                head = None
                if self.prep:
                    magic, hlen = _HEAD.unpack(s.exact(_HEAD.size))
                    if magic != MAGIC or _HEAD.size + hlen > size:
                        raise ValueError("prep cache: not an encoded array (wrong magic or header length)")
                    head = s.exact(hlen)
                self._place(s, p, size, head)
            else:
                raise ValueError(f"batch answer: unexpected field {name!r}")

    def _place(self, s, p, size, head):
        """Reads the payload (after any prep header) into row p."""
        if not self.prep:
            if self.mem is None:
                self.setup(None, np.uint8, (size,))
            if size != self.nbytes:
                raise ValueError(f"DeviceLoader: raw items differ in size ({size} and {self.nbytes} bytes); "
                                 "use a prep stage (cache_stage) or decode='jpeg'")
            s.into(self.row(p))
            return
        self.layout(head)
        if size - _HEAD.size - len(head) != self.nbytes:
            raise ValueError("prep cache: an item's bytes do not match its header")
        s.into(self.row(p))

    def fill(self, arrays):
        """Rows from decoded prep outputs (the first epoch's path)."""
        for p, a in enumerate(arrays):
            torch = sys.modules.get("torch")
            a = a.numpy() if torch is not None and isinstance(a, torch.Tensor) else np.asarray(a)
            self.setup(None, a.dtype, a.shape)
            np.copyto(np.frombuffer(self.row(p), dtype=self.dtype).reshape(self.shape), a)


def _torch_numpy_dtype(name):
    import torch

    t = getattr(torch, name)
    return torch.empty(0, dtype=t).numpy().dtype
