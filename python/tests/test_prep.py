"""The prep cache (cache_stage) over a real two-node cluster, with real
DataLoader worker processes: F runs once per item per cluster, T every time."""

import hashlib
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.utils.data  # noqa: E402

from stallfree import Client, StallfreeError  # noqa: E402
from stallfree.prep import decode, derived_name, encode  # noqa: E402
from stallfree.torch import BatchLoader, CachedDataset  # noqa: E402

from harness import Cluster, ClusterCase, wait_until  # noqa: E402


def pure_f(raw):
    """The deterministic stage: bytes to a 2-D float32 array whose shape
    depends on the item (as a decoded image's would)."""
    n = len(raw) // 4 * 4
    return (np.frombuffer(raw[:n], dtype=np.uint8).astype(np.float32) / 255.0).reshape(-1, 4)


def log_line(path, line):
    # One write in append mode: lines from several processes do not mix.
    with open(path, "a") as f:
        f.write(line + "\n")


def lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().split()


class Stage:
    """F, counting its calls (across processes: one line per call in a file)."""

    def __init__(self, log, fn=pure_f):
        self.log, self.fn = log, fn

    def __call__(self, raw):
        log_line(self.log, hashlib.sha256(raw).hexdigest()[:16])
        return self.fn(raw)


class Transform:
    """T, counting its calls; returns its input unchanged so the test can
    compare what it was given."""

    def __init__(self, log):
        self.log = log

    def __call__(self, x):
        log_line(self.log, "t")
        return x


def same_array(a, b):
    return type(a) is type(b) and a.dtype == b.dtype and tuple(a.shape) == tuple(b.shape) and \
        (a.numpy().tobytes() if isinstance(a, torch.Tensor) else a.tobytes()) == \
        (b.numpy().tobytes() if isinstance(b, torch.Tensor) else b.tobytes())


class EncodingTest(unittest.TestCase):
    def test_round_trip(self):
        for v in [np.arange(24, dtype=np.uint8).reshape(2, 3, 4), np.zeros((0, 3), dtype=np.float64),
                  np.arange(6, dtype=">i4").reshape(3, 2)[::2], torch.arange(12, dtype=torch.float32).reshape(3, 4),
                  torch.arange(5, dtype=torch.bfloat16), torch.zeros((2, 0), dtype=torch.int64)]:
            got = decode(encode(v))
            want = np.ascontiguousarray(v) if isinstance(v, np.ndarray) else v
            if isinstance(v, torch.Tensor) and v.dtype == torch.bfloat16:
                self.assertEqual((got.dtype, tuple(got.shape)), (v.dtype, tuple(v.shape)))
                self.assertTrue(torch.equal(got, v))
                continue
            self.assertTrue(same_array(got, want), (v, got))
        with self.assertRaises(TypeError):
            encode([1, 2, 3])
        with self.assertRaises(ValueError):
            decode(b"not an array at all")

    def test_names(self):
        self.assertEqual(derived_name("imgs", "decoded-224-v1"), "imgs.decoded-224-v1")
        odd = derived_name("imgs", "resize 224/crop")
        self.assertRegex(odd, r"^imgs\.[0-9a-f]{16}$")
        self.assertNotEqual(odd, derived_name("imgs", "resize 256/crop"))


class PrepTest(ClusterCase):
    def setUp(self):
        self.make_tmp("stallfree-prep")
        self.write_files(48, 5, lambda i: f"c{i % 3}/x{i:03d}.bin", 200, 1500)
        self.cluster = Cluster(self.tmp)
        (_, self.url1), (_, self.url2) = self.cluster.nodes
        c = Client(self.url1)
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")
        self.want = [pure_f(self.files[k]) for k in self.keys]
        self.flog, self.tlog = os.path.join(self.tmp, "f.log"), os.path.join(self.tmp, "t.log")

    def epoch(self, url, stage, batched):
        """One epoch through a DataLoader with 2 workers: per item
        (__getitem__) or per minibatch (__getitems__, through a BatchSampler)."""
        ds = CachedDataset(url, "ds", transform=Transform(self.tlog), cache_stage=(stage, Stage(self.flog)))
        if batched:
            sampler = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(ds), 8, False)
            loader = torch.utils.data.DataLoader(ds, sampler=sampler, batch_size=None, num_workers=2,
                                                 collate_fn=lambda b: b)
        else:
            loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, collate_fn=list)
        return [x for batch in loader for x in batch]

    def assert_f_once_per_item(self, calls):
        want = sorted(hashlib.sha256(self.files[k]).hexdigest()[:16] for k in self.keys)
        self.assertEqual(sorted(calls), want, "F must run exactly once per item")

    def test_stage_runs_once_per_item_per_cluster(self):
        n = len(self.keys)
        got = self.epoch(self.url1, "f-v1", batched=False)
        self.assert_f_once_per_item(lines(self.flog))
        self.assertEqual(len(lines(self.tlog)), n)
        for i, x in enumerate(got):
            self.assertTrue(same_array(x, self.want[i]), f"epoch 1 item {i}")

        info = Client(self.url2).dataset(derived_name("ds", "f-v1"))
        self.assertEqual((info["derived_from"], info["stage"], info["written"]), ("ds", "f-v1", n))
        self.assertEqual(info, Client(self.url1).dataset(derived_name("ds", "f-v1")))

        # Epoch 2, whole minibatches: F zero times, T once per item, exactly F's output.
        got = self.epoch(self.url1, "f-v1", batched=True)
        self.assertEqual(len(lines(self.flog)), n)
        self.assertEqual(len(lines(self.tlog)), 2 * n)
        for i, x in enumerate(got):
            self.assertTrue(same_array(x, self.want[i]), f"epoch 2 item {i}")

        # Another dataset object, on the other node: F zero times.
        got = self.epoch(self.url2, "f-v1", batched=False)
        self.assertEqual(len(lines(self.flog)), n)
        for i, x in enumerate(got):
            self.assertTrue(same_array(x, self.want[i]), f"node 2 item {i}")

        # A new stage starts fresh: F once per item again (minibatches of misses).
        os.remove(self.flog)
        got = self.epoch(self.url2, "f-v2", batched=True)
        self.assert_f_once_per_item(lines(self.flog))
        for i, x in enumerate(got):
            self.assertTrue(same_array(x, self.want[i]), f"stage 2 item {i}")

    def test_batch_loader(self):
        """BatchLoader's threads fetch whole minibatches through the same hook."""
        ds = CachedDataset(self.url2, "ds", transform=Transform(self.tlog), cache_stage=("bl-v1", Stage(self.flog)))
        n = len(self.keys)
        for epoch in range(2):
            got = [x for batch in BatchLoader(ds, 8, threads=3, collate_fn=list) for x in batch]
            self.assertEqual(len(got), n)
            for i, x in enumerate(got):
                self.assertTrue(same_array(x, self.want[i]), f"epoch {epoch} item {i}")
            self.assert_f_once_per_item(lines(self.flog))  # epoch 2 adds no call
        self.assertEqual(len(lines(self.tlog)), 2 * n)

    def test_owner_routed(self):
        """route="owner": misses are answered by the owner (not written), not
        taken for routing failures that refetch the owner table."""
        ds = CachedDataset(self.url1, "ds", route="owner", cache_stage=("owner-v1", Stage(self.flog)))
        fetched = []
        owners = ds.client.owners
        ds.client.owners = lambda name: fetched.append(name) or owners(name)
        for _ in range(2):
            for i in range(len(self.keys)):
                self.assertTrue(same_array(ds[i], self.want[i]), f"item {i}")
        self.assert_f_once_per_item(lines(self.flog))
        self.assertLessEqual(len(fetched), 2, "the owner table was fetched again after misses")

    def test_conflict_reads_what_is_there_and_errors_propagate(self):
        raw_index = {self.files[k]: i for i, k in enumerate(self.keys)}
        c = Client(self.url2)
        first = torch.full((2, 2), 7, dtype=torch.int16)

        def racing(raw):
            # Another process writes item i first, with other (equally valid) bytes.
            i = raw_index[raw]
            c.request("PUT", f"/v1/datasets/{derived_name('ds', 'race')}/index/{i}", encode(first))
            return torch.zeros((2, 2), dtype=torch.int16)

        ds = CachedDataset(self.url1, "ds", cache_stage=("race", racing))
        self.assertTrue(same_array(ds[3], first), "after a 409 the first writer's result counts")
        self.assertTrue(same_array(ds.__getitems__([3, 4])[1], first))

        def boom(raw):
            raise KeyError("the user's own error")

        bad = CachedDataset(self.url1, "ds", cache_stage=("boom", boom))
        with self.assertRaises(KeyError):
            bad[0]
        with self.assertRaises(KeyError):
            bad.__getitems__([0, 1])
        with self.assertRaises(StallfreeError) as e:
            c.index(derived_name("ds", "boom"), 0)
        self.assertEqual((e.exception.status, e.exception.message), (404, "not written"))

        with self.assertRaises(TypeError):
            CachedDataset(self.url1, "ds", cache_stage=("list", lambda raw: [1, 2]))[0]
        with self.assertRaises(ValueError):
            CachedDataset(self.url1, "ds", with_key=True, cache_stage=("keyed", pure_f))


if __name__ == "__main__":
    unittest.main()
