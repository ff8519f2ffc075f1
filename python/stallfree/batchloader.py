"""BatchLoader: whole minibatches fetched by threads in the training process.

A ``torch.utils.data.DataLoader`` with worker processes moves every sample
twice more than it needs to: the worker assembles the batch, then pickles it
(or copies it into shared memory) for the main process. With the cache, the
bytes are one request away, so threads in the training process fetch each
minibatch whole (one batch request, or one per owner node with
``route="owner"``), run the transforms (numpy and torch release the GIL in
their heavy calls) and collate, a bounded number of batches ahead of the loop.
"""

import collections
import concurrent.futures
import multiprocessing
import random
import time

from ._forked import one_intraop_thread
from .client import NodeUnreachable, StallfreeError
from .labels import Labels

try:
    import torch
    from torch.utils.data import default_collate as _default_collate
except ImportError:  # torch is optional: batches are lists then
    torch = None
    _default_collate = None


def _as_list(batch):
    return batch


_worker_loader = None  # in a worker process: the BatchLoader it works for


def _worker_init(loader, ids):
    global _worker_loader
    _worker_loader = loader
    one_intraop_thread()
    with ids.get_lock():
        wid = ids.value
        ids.value += 1
    _as_dataloader_worker(wid, loader)


def _as_dataloader_worker(wid, loader):
    """Makes this worker process one of a DataLoader's to torch:
    ``get_worker_info()`` answers its id, the worker count, a seed and the
    dataset, and torch's ``default_collate`` stacks each batch straight into
    shared memory, so the batch reaches the training process without the
    copy pickling it would make (a batch of 64 float images is 38 MB). Where
    torch's layout differs (a private module), batches are copied on the way
    instead, as before."""
    if torch is None:
        return
    try:
        from torch.utils.data._utils import worker

        worker._worker_info = worker.WorkerInfo(id=wid, num_workers=loader.workers, seed=loader.seed + wid,
                                                dataset=loader.dataset)
    except (ImportError, AttributeError, TypeError):  # pragma: no cover - another torch
        pass


def _worker_fetch(indices):
    return _worker_loader._fetch(indices)


class BatchLoader:
    """An iterable of minibatches of ``dataset`` in the sampler's order.

    ``dataset`` is a ``CachedDataset`` (anything with ``__getitems__``, or
    plain ``__getitem__``, works too). Each minibatch is fetched by one of
    ``threads`` background threads with one ``__getitems__`` call (one batch
    request per owner node), ``transform`` is applied to each sample and
    ``collate_fn`` (torch's ``default_collate`` by default) to the list, all in
    that thread. At most ``prefetch`` batches are fetched ahead of the loop:
    by default ``threads + 2``, or with worker processes ``2 * workers`` when
    that is more (as a DataLoader's ``prefetch_factor`` of 2), so that every
    worker has a batch in hand and the next one queued.

    ``sampler`` (e.g. ``LocalitySampler``) gives the order; without one,
    ``shuffle`` draws a fresh permutation each epoch from ``seed`` and the
    epoch (``set_epoch``, as ``DistributedSampler`` does), else the order is
    0..N-1. ``set_epoch(e)`` is passed on to the sampler. ``state_dict()``
    asks a resumable sampler for its state at the samples the loop has
    actually received (not the ones prefetched).

    ``workers=N`` moves the fetch, the transforms and the collate of each
    minibatch into N worker processes (forked when the iteration starts, and
    gone at its end), for transforms that hold the GIL (PIL, Python code):
    threads then only wait, and batches come back through shared memory
    (torch's tensors) as a DataLoader's do: in a worker,
    ``torch.utils.data.get_worker_info()`` answers as in a DataLoader's, and
    ``default_collate`` stacks into shared memory directly.

    ``labels="folder"`` or ``labels=fn(key)`` (``stallfree.labels``; needs a
    ``CachedDataset``) makes each batch ``(x, y)``: x the collated samples,
    y their labels (an int64 tensor; a numpy array without torch).

    A node that cannot be reached, or refuses the token, fails here, at
    construction, with a message naming it. A batch whose fetch fails (a node
    killed mid-epoch) is fetched again, whole, up to ``retries`` times (the
    client fails over to the other nodes); every batch is yielded exactly
    once, in order, or the error is raised naming the nodes tried.
    """

    def __init__(self, dataset, batch_size, sampler=None, shuffle=False, drop_last=False, threads=4,
                 transform=None, collate_fn=None, prefetch=None, seed=0, retries=3, labels=None, workers=0):
        if int(batch_size) < 1:
            raise ValueError(f"batch_size={batch_size!r}: want a positive integer")
        if int(threads) < 1:
            raise ValueError(f"threads={threads!r}: want at least 1")
        if int(workers) < 0:
            raise ValueError(f"workers={workers!r}: want 0 (threads only) or more")
        if sampler is not None and shuffle:
            raise ValueError("sampler and shuffle=True exclude each other (the sampler decides the order)")
        self.dataset, self.batch_size, self.sampler = dataset, int(batch_size), sampler
        self.shuffle, self.drop_last, self.threads = shuffle, drop_last, int(threads)
        self.transform = transform
        if collate_fn is None:
            collate_fn = _default_collate or _as_list
        self.collate_fn = collate_fn
        self.workers = int(workers)
        # threads + 2 alone left workers idle: on 16 cores, 12 workers with 6
        # batches in flight ran at half a DataLoader's rate for the same CPU.
        default = max(self.threads + 2, 2 * self.workers)
        self.prefetch = max(1, int(prefetch) if prefetch is not None else default)
        self.seed, self.retries, self.epoch = int(seed), int(retries), 0
        self._consumed = 0  # samples handed to the loop in the current iteration
        self._check_reachable()
        self.labels = None
        if labels is not None:
            if not hasattr(dataset, "items"):
                raise TypeError("BatchLoader: labels= needs a CachedDataset (it labels by index and key)")
            self.labels = Labels(labels, dataset.client, dataset.name, dataset.tar)

    def _check_reachable(self):
        """Fails now, in the caller's thread, rather than inside a thread."""
        client, name = getattr(self.dataset, "client", None), getattr(self.dataset, "name", None)
        if client is None or name is None:
            return
        try:
            client.dataset(name)
        except StallfreeError as e:
            where, me = ", ".join(client.urls), type(self).__name__
            if e.status == 401:
                raise StallfreeError(401, f"{me}: the node at {where} refused the token ({e.message}); "
                                          "pass the cluster's token") from e
            raise StallfreeError(e.status, f"{me}: dataset {name!r} at {where}: {e.message}") from e
        except NodeUnreachable as e:
            raise NodeUnreachable(e.nodes, f"{type(self).__name__}: {e.__cause__ or e}") from e

    # -- order -------------------------------------------------------------

    def set_epoch(self, epoch):
        self.epoch = int(epoch)
        if self.sampler is not None and hasattr(self.sampler, "set_epoch"):
            self.sampler.set_epoch(epoch)

    def _indices(self):
        if self.sampler is not None:
            return iter(self.sampler)
        n = len(self.dataset)
        if not self.shuffle:
            return iter(range(n))
        order = list(range(n))
        random.Random(self.seed * 1_000_003 + self.epoch).shuffle(order)
        return iter(order)

    def _samples(self):
        return len(self.sampler) if self.sampler is not None else len(self.dataset)

    def __len__(self):
        n = self._samples()
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def _batches(self):
        batch = []
        for i in self._indices():
            batch.append(int(i))
            if len(batch) == self.batch_size:
                yield batch
                batch = []
        if batch and not self.drop_last:
            yield batch

    # -- resumable samplers ---------------------------------------------------

    def state_dict(self):
        """The sampler's state at what the loop has received so far."""
        if self.sampler is None or not hasattr(self.sampler, "state_dict"):
            raise TypeError("state_dict needs a resumable sampler (e.g. LocalitySampler)")
        return self.sampler.state_dict(consumed=self._consumed)

    def load_state_dict(self, state):
        self.sampler.load_state_dict(state)
        self.epoch = int(state.get("epoch", self.epoch))

    # -- fetching --------------------------------------------------------------

    def _retrying(self, fetch):
        """fetch(), tried again on node loss (up to ``retries`` times)."""
        last = None
        try:
            for attempt in range(self.retries + 1):
                try:
                    return fetch()
                except (NodeUnreachable, StallfreeError) as e:
                    # The client has tried every node it knows; membership may
                    # settle (a dead owner leaves the ring) before the next try.
                    if isinstance(e, StallfreeError) and e.status not in (502, 503, 504):
                        raise
                    last = e
                    time.sleep(min(0.5 * (attempt + 1), 2.0))
            raise last
        finally:
            # As in Client.request: the caught exception and this frame would
            # hold each other, and fetch (its pooled buffer) with them.
            last = None

    def _fetch(self, indices):
        ds = self.dataset
        keys = None
        if self.labels is not None:
            keys, samples = self._retrying(lambda: ds.items(indices, keys=self.labels.needs_keys))
        elif hasattr(ds, "__getitems__"):
            samples = self._retrying(lambda: ds.__getitems__(indices))
        else:
            samples = self._retrying(lambda: [ds[i] for i in indices])
        if len(samples) != len(indices):
            raise RuntimeError(f"dataset returned {len(samples)} samples for {len(indices)} indices")
        if self.transform is not None:
            samples = [self.transform(s) for s in samples]
        if self.labels is None:
            return self.collate_fn(samples)
        y = self.labels.of(indices, keys)
        return self.collate_fn(samples), (torch.from_numpy(y) if torch is not None else y)

    def _executor(self):
        """(executor, function fetching one batch in it)."""
        if not self.workers:
            pool = concurrent.futures.ThreadPoolExecutor(max_workers=self.threads, thread_name_prefix="stallfree-batch")
            return pool, self._fetch
        # Forked: the workers inherit this loader (dataset, transforms) without
        # pickling it; each opens its own connections (Client checks its pid).
        ctx = multiprocessing.get_context("fork")
        pool = concurrent.futures.ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx,
                                                      initializer=_worker_init, initargs=(self, ctx.Value("i", 0)))
        return pool, _worker_fetch

    def __iter__(self):
        self._consumed = 0
        pool, fetch = self._executor()
        pending = collections.deque()  # (future, batch size) in sampler order
        batches = self._batches()
        try:
            for indices in batches:
                pending.append((pool.submit(fetch, indices), len(indices)))
                if len(pending) >= self.prefetch:
                    yield self._next(pending)
            while pending:
                yield self._next(pending)
        finally:
            for f, _ in pending:  # the loop stopped early: drop what was fetched ahead
                f.cancel()
            pool.shutdown(wait=bool(self.workers))  # worker processes are reaped, not left behind

    def _next(self, pending):
        f, n = pending.popleft()
        batch = f.result()
        self._consumed += n
        return batch
