"""Coordinated prep's prep-cache route on a real two-node cluster: jobs of a
group with ``cache_stage`` stage F's outputs while the prep cache fills (F
once per item in the cluster), then read the cache and augment it
themselves, staging nothing, and still yield byte-identical batches."""

import hashlib
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

from stallfree import Client  # noqa: E402
from stallfree.coordinated import encode_batch, epoch_order  # noqa: E402
from stallfree.prep import PrepStage  # noqa: E402

from coordinated_job import StageF, numpy_augment, torch_augment  # noqa: E402
from test_coordinated import BATCH, N, GroupCase  # noqa: E402

SEED = 7  # coordinated_job's group seed


def have_torchvision():
    try:
        import torchvision.ops  # noqa: F401
    except Exception:  # noqa: BLE001 - any failure means: not usable here
        return False
    return True


class PrepCacheRouteTest(GroupCase):
    def expected(self, epochs, augment="numpy"):
        """The digest of every batch, computed here from the items: F on
        each, stacked, augmented by (seed, epoch, index)."""
        c = Client(self.urls[0])
        raw = dict(enumerate(d for _, d in c.batch("ds", list(range(N)))))
        f = StageF()
        aug = torch_augment() if augment == "torch" else numpy_augment
        out = []
        for e in range(epochs):
            order = epoch_order(SEED, e, N)
            for b in range(N // BATCH):
                idx = order[b * BATCH:(b + 1) * BATCH]
                x = np.stack([f(raw[i]) for i in idx])
                if augment == "torch":
                    import torch

                    x = torch.from_numpy(x)
                y = aug(x, np.asarray(idx, dtype=np.int64), epoch=e, seed=SEED)
                out.append(hashlib.sha256(encode_batch(y)).hexdigest())
        return out

    def check_jobs(self, group, jobs, epochs, augment="numpy"):
        recs = [self.records(group, j) for j in range(jobs)]
        want = self.expected(epochs, augment)
        for j in range(jobs):
            self.assert_each_once(recs[j], epochs, f"job {j}")
            got = [r["digest"] for r in recs[j] if "batch" in r]
            self.assertEqual(got, want, f"job {j}: the batches made from F's outputs and the seeded augmentation")
        return recs

    def prepared(self, group):
        info = self.group(self.urls[0], group)
        return sum(j["prepared"] for j in info["jobs"]), sum(j["served"] for j in info["jobs"]), info

    def half_cached(self, group, jobs, members=None):
        """(the file counting F's calls, loaders of the jobs in members
        (default: all) of a new group of jobs) over the prep stage group-v1,
        whose odd items are not written: each loader is told the cache is
        full, as if those items had been evicted since the route was taken."""
        from stallfree.coordinated import CoordinatedLoader

        stage, c = f"{group}-v1", Client(self.urls[0])
        PrepStage(c, "ds", stage, StageF()).get_many(c, list(range(0, N, 2)))
        calls = os.path.join(self.tmp, f"{group}.calls")
        loaders = []
        for j in range(jobs) if members is None else members:
            loader = CoordinatedLoader(self.urls[j % 2], group, j, "ds", None, BATCH, jobs=jobs, seed=SEED,
                                       cache_stage=(stage, StageF(calls)), augment=numpy_augment)
            self.addCleanup(loader.close)
            self.assertFalse(loader._full(), "half the items are not written")
            loader._full = lambda: True
            loaders.append(loader)
        return calls, loaders

    def test_jobs_fill_the_cache_once_then_stage_nothing(self):
        """Three jobs, three epochs: epoch 0 stages F's outputs (F once per
        item in the cluster, job 0 preparing in worker processes); epochs 1
        and 2 read the full cache, stage nothing and still agree byte for
        byte; job 1 resumes from state_dict in a new loader mid-epoch 2."""
        epochs = 3
        procs = self.start_jobs("pc", 3, epochs=epochs, extra={
            j: ["--cache-stage", "pc-v1"] + (["--resume-at", "2:3"] if j == 1 else []) for j in range(3)})
        self.finish(procs)
        recs = self.check_jobs("pc", 3, epochs)
        for j in range(3):
            routes = {(r["epoch"], r["route"]) for r in recs[j] if "batch" in r}
            self.assertEqual(routes, {(0, "staging"), (1, "prep-cache"), (2, "prep-cache")}, f"job {j}")
        resumed = [r for r in recs[1] if "resumed" in r]
        self.assertEqual([(r["resumed"]["epoch"], r["resumed"]["batch"]) for r in resumed], [(2, 3)])
        self.assertEqual(self.transform_calls(), N, "F ran once per item in the cluster, over three epochs")
        counted = sum(r["stage_calls"] for rs in recs for r in rs if "stage_calls" in r)  # a resumed loader counts anew
        self.assertEqual(counted, N, "the loaders counted the same")
        prepared, served, info = self.prepared("pc")
        self.assertEqual(prepared, N // BATCH, "only epoch 0's batches were staged")
        self.assertEqual(served, 2 * N // BATCH, "and read by the two other jobs")
        self.assertEqual(info["staged_batches"], 0)
        derived = Client(self.urls[1]).dataset("ds.pc-v1")
        self.assertEqual((derived["derived_from"], derived["written"]), ("ds", N))

    def test_a_full_cache_is_read_from_the_first_epoch(self):
        """The cache filled beforehand: two jobs with torch's batched
        augmentation (numpy's without torchvision) read it from epoch 0,
        never touch the group's stage, run F never, and agree byte for
        byte; job 1 resumes mid-epoch 1."""
        c = Client(self.urls[1])
        PrepStage(c, "ds", "pf-v1", StageF()).get_many(c, list(range(N)))
        self.assertEqual(c.dataset("ds.pf-v1")["written"], N)
        augment = "torch" if have_torchvision() else "numpy"
        epochs = 2
        procs = self.start_jobs("pf", 2, epochs=epochs, extra={
            0: ["--cache-stage", "pf-v1", "--augment", augment],
            1: ["--cache-stage", "pf-v1", "--augment", augment, "--resume-at", "1:2"]})
        self.finish(procs)
        recs = self.check_jobs("pf", 2, epochs, augment)
        for j in range(2):
            self.assertEqual({r["route"] for r in recs[j] if "batch" in r}, {"prep-cache"}, f"job {j}")
            self.assertEqual(recs[j][-1]["stage_calls"], 0)
        self.assertFalse(os.path.exists(self.calls) and self.transform_calls(), "F never ran in the jobs")
        prepared, served, info = self.prepared("pf")
        self.assertEqual((prepared, served, info["staged_batches"]), (0, 0, 0), "nothing staged, nothing read")

    def test_items_missing_on_the_prep_cache_route_are_made_by_the_reader(self):
        """An item evicted after the loader took the prep-cache route (here:
        half the items never written, the loader told the cache is full) is
        computed by the job that reads it, written back, and the batch is the
        same as from a full cache."""
        c = Client(self.urls[0])
        calls, (loader,) = self.half_cached("pm", 1)
        got = [hashlib.sha256(encode_batch(b)).hexdigest() for b in loader]
        self.assertEqual(loader.route, "prep-cache")
        self.assertEqual(got, self.expected(1))
        with open(calls) as f:
            self.assertEqual(sum(1 for _ in f), N // 2, "F ran on the missing items only")
        self.assertEqual(loader.stage_calls, N // 2)
        self.assertEqual(c.dataset("ds.pm-v1")["written"], N, "and they were written back")
        self.assertEqual(self.prepared("pm")[:2], (0, 0), "nothing staged")
        # The next epoch: the items node 1 holds are copied from its memory
        # (mapped), node 2's come through the socket; the same batches.
        copied = loader._mapper.copied
        second = [hashlib.sha256(encode_batch(b)).hexdigest() for b in loader]
        self.assertEqual(second, self.expected(2)[len(got):])
        self.assertGreater(loader._mapper.copied - copied, 0, "no item copied from the node's memory")
        self.assertLess(loader._mapper.copied - copied, N, "node 2's items cannot be in node 1's memory")

    def test_missing_items_are_made_by_the_batchs_producer(self):
        """Three jobs on the prep-cache route, half the items missing: each
        missing item is computed once in the group, by the producer of its
        batch, while the other jobs wait for it; every job gets the batches
        a full cache gives."""
        import threading

        c = Client(self.urls[0])
        calls, loaders = self.half_cached("pj", 3)
        got, errors = [None] * 3, []

        def run(j):
            try:
                got[j] = [hashlib.sha256(encode_batch(b)).hexdigest() for b in loaders[j]]
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)

        threads = [threading.Thread(target=run, args=(j,)) for j in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        self.assertEqual(errors, [])
        want = self.expected(1)
        for j in range(3):
            self.assertEqual(got[j], want, f"job {j}: the batches of a full cache")
            self.assertEqual(loaders[j].route, "prep-cache")
        with open(calls) as f:
            self.assertEqual(sum(1 for _ in f), N // 2, "F ran once per missing item in the group")
        order = epoch_order(SEED, 0, N)
        for j, loader in enumerate(loaders):
            mine = sum(1 for b in range(N // BATCH) if loader.producer_of(0, b) == j
                       for i in order[b * BATCH:(b + 1) * BATCH] if i % 2)
            self.assertEqual(loader.stage_calls, mine, f"job {j} computed the missing items of its own batches")
        self.assertEqual(c.dataset("ds.pj-v1")["written"], N, "and they were written back")
        self.assertEqual(self.prepared("pj")[:2], (0, 0), "nothing staged")

    def test_a_producer_that_never_writes_is_waited_for_once_an_epoch(self):
        """The producer of a batch never comes (job 1 of 2 never runs), and
        nothing job 0 computes is kept: job 0 waits for missing items once an
        epoch, asking only for those, then computes every item it misses
        that epoch itself."""
        calls, (loader,) = self.half_cached("pw", 2, members=[0])
        loader.producer_patience = 0.3
        polled, written_many = [], loader.stage.written_many

        def counted(client, indices, keys=False):
            if sys._getframe(1).f_code.co_name == "_await_items":  # a poll, not get_many's own read
                polled.append((loader.epoch, tuple(indices)))
            return written_many(client, indices, keys)

        loader.stage.written_many = counted
        # What job 0 computes is not kept (as if evicted at once), so the
        # same items are missing again in epoch 1.
        stage = loader.stage
        stage._compute_many = lambda client, indices, raws, executor=None: [stage.fn(r) for r in raws]
        got = []
        for e in range(2):
            loader.set_epoch(e)
            got += [hashlib.sha256(encode_batch(b)).hexdigest() for b in loader]
        self.assertEqual(got, self.expected(2))
        self.assertEqual(loader.stage_calls, N, "it computed every missing item itself, both epochs")
        with open(calls) as f:
            self.assertEqual(sum(1 for _ in f), N)
        for e in range(2):
            order = epoch_order(SEED, e, N)
            first = next(b for b in range(N // BATCH) if loader.producer_of(e, b) == 1)
            batch = tuple(order[first * BATCH:(first + 1) * BATCH])
            asked = [idx for ep, idx in polled if ep == e]
            self.assertGreater(len(asked), 2, f"epoch {e}: polled again while waiting")
            self.assertEqual(asked[0], batch, f"epoch {e}: only job 1's first batch waited for")
            self.assertEqual(set(asked[1:]), {tuple(i for i in batch if i % 2)}, "then only its missing items")

if __name__ == "__main__":
    unittest.main()
