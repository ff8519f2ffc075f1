"""The stall meter: how long a training loop waits for data, and how long it
holds each batch (its step time), reported to the node per job and rank.

No torch needed: it wraps any iterable of batches."""

import time

from .client import Client


def _items(batch):
    """Samples in a batch: a list of samples, a collated tensor (its first
    dimension), or a collated tuple or dict of tensors (their first one's)."""
    if isinstance(batch, dict):
        batch = next(iter(batch.values()), ())
    elif isinstance(batch, (list, tuple)) and batch and hasattr(batch[0], "shape") and len(batch[0].shape):
        batch = batch[0]
    shape = getattr(batch, "shape", None)
    if shape is not None and len(shape):
        return int(shape[0])
    try:
        return len(batch)
    except TypeError:
        return 1


class StallMeter:
    """Wraps a DataLoader iterator and measures how long the training loop
    waits for each batch (the data stall) and how long it holds each batch
    before asking for the next (the step time: forward, backward, optimizer).
    Reports to the node every ``report_every`` batches and when the epoch
    ends (``stallfree_loader_wait_seconds_total``); the node keeps the figures
    per job and rank and plans the memory split from them (``GET /v1/plan``).

        meter = StallMeter(url, loader, job="resnet", rank=0, dataset="imagenet")
        for epoch in range(epochs):
            for batch in meter: train(batch)
        print(meter.wait_seconds, meter.step_seconds, meter.batches)

    ``dataset`` defaults to the registered job's; ``count(batch)`` gives the
    samples in a batch (by default the batch's length or first dimension).
    """

    def __init__(self, url, iterable, job="", rank=0, token=None, report_every=20, dataset=None, count=None):
        self.client = url if isinstance(url, Client) else Client(url, token=token)
        self.iterable, self.job, self.rank, self.dataset = iterable, job, int(rank), dataset
        self.report_every = report_every
        self.count = count or _items
        self.wait_seconds, self.step_seconds, self.batches, self.items = 0.0, 0.0, 0, 0
        # The last complete epoch: {"wait_s", "step_s", "batches", "items", "seconds"}.
        self.last_epoch = None
        self._pending = [0.0, 0.0, 0, 0]  # wait, step, batches, items
        self._epoch = [0.0, 0.0, 0, 0]

    def __iter__(self):
        # An empty report opens this epoch's window on the node, so the
        # storage reads it counts for the epoch start with its first batch.
        self._report(epoch_end=False, force=True)
        self._epoch = [0.0, 0.0, 0, 0]
        it = iter(self.iterable)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                self._end_epoch()
                return
            t1 = time.perf_counter()
            self._add(0, t1 - t0)
            self._add(2, 1)
            self._add(3, self.count(batch))
            yield batch
            # The loop asks for the next batch: it held this one until now.
            self._add(1, time.perf_counter() - t1)
            if self._pending[2] >= self.report_every:
                self._report(epoch_end=False)

    def _add(self, field, v):
        self._pending[field] += v
        self._epoch[field] += v

    def _end_epoch(self):
        w, s, b, n = self._epoch
        self.wait_seconds += w
        self.step_seconds += s
        self.batches += b
        self.items += n
        if b:
            self.last_epoch = {"wait_s": w, "step_s": s, "batches": b, "items": n, "seconds": w + s}
        self._report(epoch_end=bool(b))

    def _report(self, epoch_end, force=False):
        w, s, b, n = self._pending
        if not (b or epoch_end or force):
            return
        self.client.report_wait(w, b, self.job, self.rank, step_seconds=s, items=n, dataset=self.dataset,
                                epoch_end=epoch_end)
        self._pending = [0.0, 0.0, 0, 0]

    def flush(self):
        """Reports what was measured since the last report."""
        self._report(epoch_end=False)
