"""Host buffers reused once nothing refers to them: the batch buffers of
the loaders (``stallfree.torch.DeviceLoader``, ``CoordinatedLoader``) and
the prep cache's encoded items. A fresh buffer of a few hundred KiB or more
comes from mmap or from the top of malloc's heap, which glibc trims back to
the kernel when freed: each reuse then faults every page in again, which
costs more CPU than filling it (on a VM, the more).
"""

import os
import sys
import threading

try:
    import numpy as np
except ImportError:  # pragma: no cover - a _ProcessPool is made without numpy, used only with it
    np = None

#: Buffers smaller than this are not worth pooling: malloc serves them from
#: its small bins, which no trim gives back to the kernel.
REUSE_FROM = 64 << 10


class _Buffer:
    __slots__ = ("array", "tensor", "event")

    def __init__(self, array, tensor):
        self.array, self.tensor, self.event = array, tensor, None


class _Pool:
    """Host buffers, reused once nothing refers to them: a buffer is in use
    while a batch is read into it and while a tensor over it (a yielded
    batch, or any view of one) lives, as numpy and torch.from_numpy hold the
    array; pinned, also until its copy to the device has run."""

    def __init__(self, pinned, keep):
        self.pinned, self.keep = pinned, keep
        self.lock = threading.Lock()
        self.buffers = []
        self.next = 0

    @staticmethod
    def _free(b):
        # Referred to by b and by getrefcount's argument only: no view.
        return sys.getrefcount(b.array) <= 2 and (b.event is None or b.event.query())

    def get(self, nbytes, capacity=None):
        """A view of nbytes of a free buffer (made under the lock, so that
        no other thread takes the buffer meanwhile); one made here holds
        ``capacity`` bytes when that is more, so that it fits later asks of
        a few percent more too (batches of JPEGs)."""
        with self.lock:
            # From the one after the last handed out: buffers come back in
            # about the order they went, so a batch's k-th item finds a free
            # one at once, not after k busy ones.
            n = len(self.buffers)
            for k in range(n):
                b = self.buffers[(self.next + k) % n]
                if len(b.array) >= nbytes and self._free(b):
                    b.event = None
                    self.next = (self.next + k + 1) % n
                    return b.array[:nbytes]
            if self.pinned:
                import torch

                t = torch.empty(max(nbytes, capacity or 0), dtype=torch.uint8, pin_memory=True)
                b = _Buffer(t.numpy(), t)
            else:
                b = _Buffer(np.empty(max(nbytes, capacity or 0), dtype=np.uint8), None)
            view = b.array[:nbytes]
            self.buffers.append(b)
            if len(self.buffers) > self.keep:  # forget free ones beyond what a loop holds at once
                self.buffers = [x for x in self.buffers if not self._free(x)]
            return view

    def busy_until(self, host, event):
        """The pinned buffer under tensor host stays in use until event."""
        ptr = host.data_ptr()
        with self.lock:
            for b in self.buffers:
                start = b.tensor.data_ptr()
                if start <= ptr < start + b.tensor.numel():
                    b.event = event
                    return


class _ProcessPool:
    """A _Pool of this process's own, made on first use: a forked worker,
    or an unpickled copy (a DataLoader worker's dataset), gets a fresh one
    rather than its parent's buffers and lock. Not pinned."""

    def __init__(self, keep):
        self.keep, self._pool = keep, None
        # Several threads make their first ask at once (a DeviceLoader's
        # fill threads): one pool for all of them.
        self._pid, self._made = os.getpid(), threading.Lock()

    def __getstate__(self):
        return {"keep": self.keep}

    def __setstate__(self, state):
        self.__init__(state["keep"])

    def get(self, nbytes):
        if self._pid != os.getpid():
            # A forked child: its own pool, and its own lock (the copy may
            # be held by a thread the fork did not bring along).
            self._pid, self._made, self._pool = os.getpid(), threading.Lock(), None
        with self._made:
            if self._pool is None:
                self._pool = _Pool(pinned=False, keep=self.keep)
            pool = self._pool
        return pool.get(nbytes)
