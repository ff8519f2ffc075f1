"""PyTorch integration: a map-style dataset, a locality-aware sampler, a
stall meter, and the device path (``DeviceLoader``, ``augment``:
docs/device.md)."""

import http.client
import os

import torch.utils.data

from .._mapped import ItemMapper
from ..client import Client, StallfreeError
from ..batchloader import BatchLoader  # noqa: F401  (stallfree.torch.BatchLoader, docs/api.md)
from ..meter import StallMeter  # noqa: F401 - stallfree.torch.StallMeter (docs/api.md)
from ..coordinated import CoordinatedLoader  # noqa: F401  (stallfree.torch.CoordinatedLoader, docs/api.md)
from ..prep import PrepStage
from ..labels import Labels
from .device import DeviceLoader  # noqa: F401  (stallfree.torch.DeviceLoader, docs/device.md)

try:  # stallfree.torch.augment needs torchvision (roi_align); the rest does not
    from . import augment  # noqa: F401
except ImportError:
    pass


class CachedDataset(torch.utils.data.Dataset):
    """Items of a Stallfree dataset by manifest index; on a tar dataset,
    WebDataset samples by sample index, as dicts
    ``{"__key__": str, "jpg": bytes, ...}`` (``stallfree.decode`` decodes them).

    Safe in DataLoader worker processes: each process opens its own
    connections on first use. ``transform`` turns the item's bytes (or the
    sample dict) into a training sample (decode, augment); by default they
    are returned as they are. With ``with_key=True`` an item comes with its
    key, ``(key, bytes)``, and ``transform`` is called as
    ``transform(key, bytes)``.

    ``labels="folder"`` (the class folder of the key, numbered in sorted
    order, worked out once here: ``stallfree.labels``) or ``labels=fn(key)``
    makes every item ``(x, y)``: x what it would be without labels, y an
    int. Not together with ``with_key``; ``self.labels.classes`` names the
    folders.

    ``cache_stage=(stage, fn)`` caches ``fn``'s output (deterministic prep,
    e.g. decode + resize, returning a numpy array or torch tensor) in the
    cluster, once per item (``stallfree.prep``); ``transform`` then runs on
    that output (``transform(key, output)`` with ``with_key``).
    """

    def __init__(self, url, dataset, transform=None, token=None, route="local", with_key=False, cache_stage=None,
                 labels=None):
        self.url, self.name, self.transform, self.token, self.route = url, dataset, transform, token, route
        self.with_key = with_key
        self._client = None
        self._mapper, self._mapper_pid = None, None  # this process's ItemMapper (_item_mapper)
        info = self.client.dataset(dataset)
        self.tar = bool(info.get("samples"))
        self._len = int(info["samples"] if self.tar else info["items"])
        if labels is not None and with_key:
            raise ValueError("labels and with_key exclude each other (a labels function is given the key)")
        self.labels = Labels(labels, self.client, dataset, self.tar) if labels is not None else None
        self.prep = PrepStage(self.client, dataset, *cache_stage, tar=self.tar) if cache_stage else None

    @property
    def client(self):
        if self._client is None:
            self._client = Client(self.url, token=self.token, route=self.route)
        return self._client

    def __getstate__(self):  # workers get a fresh client, not the parent's sockets
        s = dict(self.__dict__)
        s["_client"], s["_mapper"], s["_mapper_pid"] = None, None, None
        return s

    def __len__(self):
        return self._len

    # Items of one batch request (the node's limit is 4096).
    max_batch = 4096

    @property
    def _keyed(self):
        """Whether items must be read with their keys."""
        return (self.with_key and not self.tar) or (self.labels is not None and self.labels.needs_keys)

    def __getitem__(self, i):
        if isinstance(i, (list, tuple)):
            return self.__getitems__(i)
        if self._keyed:
            return self.__getitems__([int(i)])[0]
        if self.prep is not None:
            data = self.prep.get(self.client, int(i))
        elif self.tar:
            data = self.client.sample(self.name, int(i))
        else:
            data = self.client.index(self.name, int(i))
        x = self.transform(data) if self.transform else data
        return (x, int(self.labels.of([int(i)])[0])) if self.labels is not None else x

    def fetch(self, indices, keys=False, into=None):
        """``(keys, items)`` of the indices before ``transform``: keys is
        None unless asked for (a tar sample dict carries its own
        ``__key__``), items are bytes, sample dicts or the prep stage's
        output. One batch request per ``max_batch`` items. With ``into``
        (``alloc(nbytes)``, a uint8 numpy array), the raw items the node on
        this host holds are copied into one such buffer per request and
        come back as uint8 arrays over it instead of bytes."""
        got_keys, out = ([] if keys else None), []
        for start in range(0, len(indices), self.max_batch):
            chunk = [int(i) for i in indices[start:start + self.max_batch]]
            if self.prep is not None:
                # The parent's items as _read reads them: those resident on
                # this host's node copied out of its memory.
                part = self.prep.get_many(self.client, chunk, keys=keys, parent=None if self.tar else self._read)
            elif self.tar:
                part = self.client.samples(self.name, chunk)
                part = [(d["__key__"], d) for d in part] if keys else part
            else:
                part = self._read(chunk, into)
                part = part if keys else [data for _, data in part]
            if keys:
                got_keys.extend(k for k, _ in part)
                out.extend(d for _, d in part)
            else:
                out.extend(part)
        return got_keys, out

    def _read(self, indices, into=None):
        """``(key, bytes)`` of each of indices: the items the node on this
        host holds copied out of its memory, mapped read-only (one copy of
        each byte, and the node only says where they lie: in the loader
        bench, 3-5 node µs a sample against 32-35 for a batch answer), the
        rest through one batch request (the owners' for owner routing).
        With ``into``, the mapped items' bytes are uint8 arrays over one
        buffer from it (``fetch``)."""
        mapper = self._item_mapper()
        got = None
        if mapper is not None:
            try:
                got = mapper.read_items(self.name, indices, into)
                if got is None:
                    self._mapper = None  # nothing to map on this node: plain batches from now on
            except (OSError, http.client.HTTPException):
                self._mapper = None  # the node gone: the batch request fails over to another
            except StallfreeError:
                pass  # a 503 while the node catches up, say: the batch request retries it, or says what it is
        if got is None:
            return self.client.batch(self.name, indices)
        left = [p for p, item in enumerate(got) if item is None]
        if left:
            for p, pair in zip(left, self.client.batch(self.name, [indices[p] for p in left])):
                got[p] = pair
        return got

    def _item_mapper(self):
        """This process's ItemMapper for the node on this host (None: none,
        or it has nothing to map)."""
        if self._mapper_pid != os.getpid():  # a new worker: its own connections, its own answer
            self._mapper, self._mapper_pid = ItemMapper.for_client(self.client), os.getpid()
        return self._mapper

    def items(self, indices, keys=False):
        """``(keys, samples)``: the samples after ``transform`` (without
        labels); keys when asked for or when labels or ``with_key`` need
        them, else None."""
        keys, data = self.fetch(indices, keys=keys or self._keyed)
        if self.with_key and not self.tar:
            pairs = zip(keys, data)
            return keys, [self.transform(k, d) for k, d in pairs] if self.transform else list(pairs)
        return keys, [self.transform(d) for d in data] if self.transform else data

    def __getitems__(self, indices):
        """Several samples with one request per ``max_batch`` items instead
        of one per sample: a node serves 64-item batches at ~1.7x the items/s of
        single GETs (BENCHMARKS.md). torch >= 2.0 DataLoaders call this with
        each minibatch; on older torch, pass ``sampler=BatchSampler(...)`` and
        ``batch_size=None`` so that ``__getitem__`` receives the list."""
        keys, xs = self.items(indices)
        if self.labels is None:
            return xs
        return list(zip(xs, self.labels.of(indices, keys).tolist()))


class LocalitySampler(torch.utils.data.Sampler):
    """This rank's locality-aware order for a registered job.

    Like ``DistributedSampler``: call ``set_epoch(e)`` before each epoch; every
    rank gets ``floor(N / world_size)`` indices, the ranks of an epoch are
    disjoint, and every global minibatch is the set plain seeded sampling
    gives, but each rank mostly gets samples its own node holds.

    Resumable: save ``state_dict()`` with the checkpoint and, in the restarted
    process, ``load_state_dict(saved)`` then ``set_epoch(saved["epoch"])``;
    the epoch continues exactly after the last sample the training loop had
    consumed, none repeated, none skipped.
    """

    def __init__(self, url, job, rank, token=None):
        self.client = Client(url, token=token)
        self.job, self.rank, self.epoch = job, int(rank), 0
        spec = self.client.job(job)
        info = self.client.dataset(spec["dataset"])
        n = int(info.get("samples") or info["items"])  # tar datasets are sampled by sample
        self.world_size = int(spec["world_size"])
        self._len = n // self.world_size
        # The job's version: orders are a function of it, so a position saved
        # under one version means nothing under another, except under the
        # version that replaced it by a resize (``previous``).
        self.generation = int(spec.get("version", 0))
        self._previous = spec.get("previous")
        self._start = 0  # where this epoch resumes (a loaded checkpoint)
        self._yielded = 0  # indices handed out since this epoch's iteration began
        # (generation, position) an epoch interrupted under a resized job's
        # previous layout was resumed from, and that epoch; None otherwise.
        self._resumed, self._resumed_epoch = None, None
        self._orders = {}

    def set_epoch(self, epoch):
        epoch = int(epoch)
        if epoch != self.epoch:
            self._start = 0  # a resumed position belongs to its own epoch only
        self.epoch = epoch
        self._yielded = 0

    def _order(self):
        resumed = self._resumed if self._resumed_epoch == self.epoch else None
        key = (self.epoch, resumed)
        if key not in self._orders:
            if resumed:
                order = self.client.resumed_order(self.job, self.epoch, self.rank, *resumed)
            else:
                order = self.client.rank_order(self.job, self.epoch, self.rank)
            self._orders = {key: order}  # one epoch at a time
        return self._orders[key]

    def __iter__(self):
        order = self._order()
        self._yielded = 0
        for i in order[self._start:]:
            self._yielded += 1
            yield i

    def __len__(self):
        if self._resumed_epoch == self.epoch:
            return len(self._order()) - self._start
        return self._len - self._start

    def state_dict(self, consumed=None):
        """A small JSON-serialisable dict to save with a checkpoint.

        ``position`` is how many samples of the epoch the training loop has
        consumed. A plain DataLoader prefetches ahead of the loop, so pass
        ``consumed`` (samples consumed since this epoch's iteration began,
        e.g. ``batches_done * batch_size``); without it the sampler counts what
        it has handed out, which is what torchdata's ``StatefulDataLoader``
        expects (it snapshots the sampler as each batch is made and keeps the
        snapshot of the batch the loop last received). An epoch that was
        itself resumed after a resize also records where it was resumed from.
        """
        done = self._yielded if consumed is None else int(consumed)
        if done < 0 or done > len(self):
            raise ValueError(f"consumed {done} is outside this epoch's {len(self)} remaining samples")
        state = {"job": self.job, "generation": self.generation, "epoch": self.epoch, "rank": self.rank,
                 "world_size": self.world_size, "position": self._start + done}
        if self._resumed_epoch == self.epoch and self._resumed:
            state["resumed_from"] = list(self._resumed)
        return state

    def report(self, state=None):
        """Tell the node how far this rank has got (``cachectl jobs ls`` shows
        it): call it when saving a checkpoint, with the state saved. Best
        effort: a node that cannot be told does not stop training."""
        state = state or self.state_dict()
        try:
            self.client.json("POST", f"/v1/jobs/{self.client._q(self.job)}/ranks/{int(state['rank'])}/position",
                             {"generation": state["generation"], "epoch": state["epoch"], "position": state["position"]})
        except Exception:  # noqa: BLE001 - reporting is for operators only
            pass

    def load_state_dict(self, state):
        """Continue from a ``state_dict()``: the next iteration of its epoch
        starts at its position. A state saved before the job was resized
        (``PUT /v1/jobs/{job}`` with another world_size or ranks) resumes that
        epoch with this rank's share of what all the old ranks had left: every
        remaining sample once across the new ranks (all old ranks must have
        been at the same position, as in synchronous data-parallel training).
        """
        if state.get("job") != self.job:
            raise ValueError(f"state of job {state.get('job')!r}, not of job {self.job!r}")
        gen, position, epoch = int(state["generation"]), int(state["position"]), int(state["epoch"])
        if gen == self.generation:
            if int(state.get("rank", -1)) != self.rank or int(state.get("world_size", 0)) != self.world_size:
                raise ValueError(f"state of rank {state.get('rank')} of {state.get('world_size')}, "
                                 f"not of rank {self.rank} of {self.world_size}")
            resumed = state.get("resumed_from")
            self._resumed = tuple(int(x) for x in resumed) if resumed else None
            self._resumed_epoch = epoch if resumed else None
            self.epoch, self._start, self._yielded = epoch, 0, 0
            if not 0 <= position <= len(self):
                raise ValueError(f"position {position} outside an epoch of {len(self)} samples")
            self._start = position
            return
        if not self._previous or int(self._previous["generation"]) != gen:
            raise ValueError(f"job {self.job!r} is at generation {self.generation}; a state of generation {gen} "
                             f"is neither it nor the one it replaced: start its next epoch instead")
        self.epoch, self._start, self._yielded = epoch, 0, 0
        self._resumed, self._resumed_epoch = (gen, position), epoch
        len(self)  # fetch the re-split order now: a bad state fails here, not in a worker

    def __getstate__(self):
        s = dict(self.__dict__)
        s["client"] = Client(self.client.urls, token=self.client.token)
        return s
