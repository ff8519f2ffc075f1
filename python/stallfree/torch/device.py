"""DeviceLoader: batches from the cache to the accelerator without a Python
object per sample (docs/device.md).

A batch of fixed-shape items (the prep cache's arrays, or raw items of one
size) goes into one contiguous ``(B, ...)`` host buffer. Items the node on
this host holds are copied from its item cache, mapped read-only
(``stallfree._mapped``): one copy of each byte, no per-item work in the
node. The rest come from the node's msgpack batch answer: the parser reads
each item's framing (a few bytes) and hands the payload's slot in the buffer
to the socket's ``readinto``, so the bytes are copied once, by the kernel. On CUDA
the buffers are pinned and go to the device with one asynchronous copy; the
augmentation (``stallfree.torch.augment``) then runs there as a few batched
kernels. Buffers are reused once nothing refers to them any more.
"""

import concurrent.futures
import os
import threading

import numpy as np
import torch

from .._rows import _LEN, _PEEK, _Buffer, _Pool, _Rows, _Stream, _torch_numpy_dtype  # noqa: F401 - also imported from here
from .._mapped import ItemMapper, read_batch
from ..batchloader import BatchLoader
from ..client import StallfreeError

__all__ = ["DeviceLoader"]


class DeviceLoader(BatchLoader):
    """Minibatches of ``dataset`` (a ``CachedDataset``) as ``(x, y)`` on
    ``device``: x the batch after ``augment`` (a ``stallfree.torch.augment``
    transform, called as ``augment(x, indices, epoch=..., seed=seed)``), y
    the labels (an int64 tensor; None without labels).

    Items: a prep stage's arrays (``CachedDataset(..., cache_stage=...)``)
    or raw items of one size arrive as one ``(B, ...)`` tensor (the arrays'
    dtype; uint8 for raw items), read from the node straight into its buffer; with
    ``decode="jpeg"``, raw JPEG items are decoded by
    ``torchvision.io.decode_jpeg`` (on the GPU when ``device`` is CUDA) into
    a list of ``(C, H, W)`` uint8 tensors that ``augment`` crops to one
    size. Without ``augment``, x is that tensor (or list) on the device; on
    the CPU it is the host buffer itself, which the loader reuses only once
    nothing refers to it.

    ``labels="folder"``, ``labels=fn(key)`` or the dataset's own labels
    give y. The order, ``set_epoch`` (also the augmentation's epoch),
    ``len``, ``state_dict`` at what the loop received, owner routing
    (``CachedDataset(route="owner")``: one request per owner) and retries
    after a node's loss are BatchLoader's. ``threads`` read batches ahead,
    at most ``prefetch`` of them. While a prep stage fills (the first
    epoch), F runs on a batch's items side by side in ``fill_threads``
    threads, so F must be safe to call from several threads at once
    (default: the CPUs this process may run on, divided among the
    ``LOCAL_WORLD_SIZE`` loaders torchrun starts on a host, at most 32).
    The dataset's own ``transform`` is not used (the loader reads items
    raw): pass ``augment``.
    """

    def __init__(self, dataset, batch_size, *, device, augment=None, labels=None, decode=None, sampler=None,
                 shuffle=False, drop_last=False, threads=4, prefetch=2, seed=0, retries=3, fill_threads=None):
        if not hasattr(dataset, "fetch") or not hasattr(dataset, "prep"):
            raise TypeError("DeviceLoader reads a stallfree.torch.CachedDataset")
        if dataset.tar:
            raise ValueError(f"DeviceLoader: {dataset.name!r} is a tar dataset; its samples are dicts, not items")
        if dataset.transform is not None or dataset.with_key:
            raise ValueError("DeviceLoader reads items raw: give the dataset no transform or with_key; pass augment=")
        if decode not in (None, "jpeg"):
            raise ValueError(f"decode={decode!r}: want None or 'jpeg'")
        if decode and dataset.prep is not None:
            raise ValueError("decode='jpeg' reads raw JPEG items, not a prep stage's arrays")
        if int(batch_size) > dataset.max_batch:
            raise ValueError(f"batch_size={batch_size}: at most {dataset.max_batch} (one batch request)")
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"device={device!r}: CUDA is not available")
        super().__init__(dataset, batch_size, sampler=sampler, shuffle=shuffle, drop_last=drop_last,
                         threads=threads, prefetch=prefetch, seed=seed, retries=retries, labels=labels)
        if self.labels is None:
            self.labels = dataset.labels
        self.augment, self.decode = augment, decode
        self._cuda = self.device.type == "cuda"
        self._buffers = _Pool(pinned=self._cuda, keep=self.threads + self.prefetch + 2)
        if fill_threads is not None and int(fill_threads) < 1:
            raise ValueError(f"fill_threads={fill_threads!r}: want at least 1")
        # F runs on a batch's items side by side in these threads while the
        # prep cache fills (Pillow lets go of the GIL while it decodes and
        # resizes): one batch thread running F item after item used one
        # core, and prefetch bounds the batches in flight.
        self.fill_threads = int(fill_threads) if fill_threads is not None else _fill_threads()
        self._fill = None
        self._fill_lock = threading.Lock()
        self._filling = False  # a pass is running: F's threads may be made
        # Raw or prep items of the node on this host are copied from its
        # mapped memory (stallfree._mapped); the others come through the socket.
        self._mapper = ItemMapper.for_client(dataset.client) if not decode else None
        # On CUDA, copy and augment in the reading thread on its own stream
        # (_to_device); False queues them on the step's stream in the loop's
        # thread, as before (kept for the bench's comparison).
        self._side_streams = True
        self._thread = threading.local()
        if decode:
            from torchvision.io import decode_jpeg  # noqa: F401 - fail here, not in a thread, without torchvision

    # -- in a thread: the batch into host memory -------------------------------

    def _fetch(self, indices):
        keys = [None] * len(indices) if self.labels is not None and self.labels.needs_keys else None
        if self.decode:
            got, raw = self._retrying(lambda: self.dataset.fetch(indices, keys=keys is not None, into=self._packed))
            # Views of one pooled buffer for the items mapped from the node
            # on this host; a writable copy of any other (frombuffer warns
            # on read-only bytes).
            x = _Jpegs(torch.from_numpy(b) if isinstance(b, np.ndarray) else
                       torch.frombuffer(bytearray(b), dtype=torch.uint8) for b in raw)
            x.host = next((t for t, b in zip(x, raw) if isinstance(b, np.ndarray)), None)
            if not self._cuda:
                x = self._decode(x)
        else:
            rows = self._retrying(lambda: self._read(indices, keys))
            x = rows.tensor()
            got = keys
        y = self.labels.of(indices, got) if self.labels is not None else None
        idx = np.asarray(indices, dtype=np.int64)
        if not self._cuda and self.augment is not None:
            # On the CPU the augmentation runs here, beside the training step
            # (torch's kernels release the GIL).
            x = self.augment(x, idx, epoch=self.epoch, seed=self.seed)
        elif self._cuda and not self.decode and self._side_streams:
            return self._to_device(x, y, idx)
        return x, y, idx

    def _to_device(self, host, y, idx):
        """In the thread that read the batch: its copy to the device and its
        augmentation, queued on this thread's own stream. On the training
        step's stream they would wait for the step queued before them and
        hold the next one back (a 50 MB copy alone is ~2 ms a batch); here
        they run beside it, and the loop's thread launches nothing for them.
        Returns (x, ready), y, idx, with ready the event the step's stream
        waits for."""
        stream = getattr(self._thread, "stream", None)
        if stream is None:
            stream = self._thread.stream = torch.cuda.Stream(self.device)
        with torch.cuda.stream(stream):
            x, y = self._on_device(host, y, idx, stream)
            ready = torch.cuda.Event()
            ready.record(stream)
        return (x, ready), y, idx

    def _on_device(self, x, y, idx, stream):
        """The batch onto the device, queued on ``stream`` (the current one):
        JPEG bytes decoded there, a host buffer copied (and kept from reuse
        until the copy has run), then the augmentation and the labels."""
        if isinstance(x, list):
            host = x
            x = self._decode(host)
            decoded = torch.cuda.Event()
            decoded.record(stream)
            # The items mapped from the node share one pooled buffer (the
            # rest are copies of their own): in use until the decode has run.
            if getattr(host, "host", None) is not None:
                self._buffers.busy_until(host.host, decoded)
        else:
            host = x
            x = host.to(self.device, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(stream)
            self._buffers.busy_until(host, copied)
        if self.augment is not None:
            x = self.augment(x, idx, epoch=self.epoch, seed=self.seed)
        if y is not None:  # pinned, so that the copy waits for nothing queued on the device
            y = torch.from_numpy(y).pin_memory().to(self.device, non_blocking=True)
        return x, y

    def _read(self, indices, keys):
        ds, client = self.dataset, self.dataset.client
        prep = ds.prep
        name = prep.name if prep else ds.name
        rows = _Rows(self._buffers, len(indices), prep is not None)
        try:
            self._mapper = read_batch(client, self._mapper, name, indices, rows, keys, prep is not None)
        except StallfreeError as e:
            if prep is None or e.status != 404:
                raise
            # Not every item is written yet (the first epoch): compute them.
            rows = _Rows(self._buffers, len(indices), True)
            got = prep.get_many(client, indices, keys=keys is not None, parent=ds._read, executor=self._filler())
            if keys is not None:
                keys[:] = [k for k, _ in got]
                got = [a for _, a in got]
            rows.fill(got)
        return rows

    def __iter__(self):
        with self._fill_lock:
            self._filling = True
        try:
            yield from super().__iter__()
        finally:
            # F's threads end with the pass that made them: idle threads
            # left behind would outlive the fill, and a later fork (a
            # DataLoader's workers) would copy a multi-threaded process. A
            # batch thread still reading for a pass stopped early makes
            # none again: it runs F itself, for a batch nobody takes.
            with self._fill_lock:
                fill, self._fill, self._filling = self._fill, None, False
            if fill is not None:
                fill.shutdown(wait=False)

    def _filler(self):
        """The threads F runs in, made at the first batch of a pass with an
        item to compute (None once the pass is over)."""
        with self._fill_lock:
            if self._fill is None and self._filling:
                self._fill = concurrent.futures.ThreadPoolExecutor(max_workers=self.fill_threads,
                                                                   thread_name_prefix="stallfree-fill")
            return self._fill

    def _packed(self, nbytes):
        """A pooled host buffer for a batch of JPEGs: one made here holds
        an eighth more, in whole MiB, so that it fits the next batches too
        (their sizes differ by a few percent), and the pool reuses it
        instead of making another."""
        return self._buffers.get(nbytes, capacity=-(-(nbytes + nbytes // 8) // (1 << 20)) << 20)

    def _decode(self, data):
        from torchvision.io import decode_jpeg, ImageReadMode
        device = self.device if self._cuda else "cpu"
        if _decodes_lists():
            # One call for the whole batch: on CUDA, nvjpeg decodes it as a
            # batch, where one call per image pays a launch and a sync each.
            return list(decode_jpeg(list(data), mode=ImageReadMode.RGB, device=device))
        return [decode_jpeg(d, mode=ImageReadMode.RGB, device=device) for d in data]

    # -- in the loop's thread: onto the device ----------------------------------

    def _next(self, pending):
        x, y, idx = super()._next(pending)
        if isinstance(x, tuple):  # on the device already (_to_device): the step's stream waits for it
            x, ready = x
            step = torch.cuda.current_stream(self.device)
            step.wait_event(ready)
            # Made on another stream: the allocator must not reuse their
            # memory there before the step's stream is done with them.
            x.record_stream(step)
            if y is not None:
                y.record_stream(step)
            return x, y
        if self._cuda:
            # On the stream of the loader's device, which is not the current
            # device's when the loader's is cuda:1.
            return self._on_device(x, y, idx, torch.cuda.current_stream(self.device))
        return x, (torch.from_numpy(y) if y is not None else None)


class _Jpegs(list):
    """A batch's JPEG items as 1-D uint8 tensors; ``host``, one of them that
    is a view of the pooled buffer the mapped items were copied into (None:
    none was), which stays in use until the decode on the device has run."""

    host = None


def _fill_threads(environ=os.environ):
    """fill_threads' default: the CPUs this process may run on, shared
    among the loaders torchrun starts on this host (one per local rank,
    LOCAL_WORLD_SIZE), at most 32 (as ThreadPoolExecutor's own default)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        cpus = os.cpu_count() or 1
    try:
        local = max(1, int(environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        local = 1
    return max(1, min(32, cpus // local))


def _decodes_lists():
    """Whether this torchvision's ``decode_jpeg`` takes a list of images
    (0.19 and later); earlier ones take one image a call."""
    import torchvision

    try:
        major, minor = (int(p) for p in torchvision.__version__.split("+")[0].split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (0, 19)
