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
from stallfree.prep import _chunks, decode, derived_name, encode  # noqa: E402
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

    def test_the_format_is_header_then_the_bytes(self):
        # Items written by any version must read back in every other: the
        # layout is fixed, whatever encode does to build it.
        v = np.arange(24, dtype="<u2").reshape(2, 3, 4)
        h = b'{"kind":"numpy","dtype":"<u2","shape":[2,3,4]}'
        self.assertEqual(bytes(encode(v)), b"SFPC" + len(h).to_bytes(4, "little") + h + v.tobytes())
        t = torch.arange(6, dtype=torch.int16).reshape(2, 3)
        h = b'{"kind":"torch","dtype":"int16","shape":[2,3]}'
        self.assertEqual(bytes(encode(t)), b"SFPC" + len(h).to_bytes(4, "little") + h + t.numpy().tobytes())

    def test_decode_without_a_copy_is_a_writable_view(self):
        for v in [np.arange(12, dtype=np.float32).reshape(3, 4), torch.arange(12, dtype=torch.float32).reshape(3, 4)]:
            data = encode(v)
            got = decode(data, copy=False)
            self.assertTrue(same_array(got, v if isinstance(v, torch.Tensor) else np.ascontiguousarray(v)))
            got[0, 0] = 42  # writable, and data's own bytes: no copy was made
            self.assertEqual(decode(data)[0, 0], 42)
            copied = decode(data)
            copied[0, 1] = 7
            self.assertNotEqual(decode(data)[0, 1], 7, "decode() copies")
        with self.assertRaises(ValueError):
            decode(bytearray(b"short"), copy=False)

    def test_decode_without_a_copy_stays_aligned(self):
        # The header's length puts the bytes at any offset: where it is no
        # multiple of the item size, decode copies rather than hand out a
        # misaligned array.
        for shape in [(3,), (3, 4), (10, 11, 12), (7, 1)]:
            for v in [np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape),
                      torch.arange(int(np.prod(shape)), dtype=torch.float64).reshape(shape)]:
                got = decode(encode(v), copy=False)
                if isinstance(got, torch.Tensor):
                    self.assertEqual(got.data_ptr() % 8, 0, shape)
                else:
                    self.assertTrue(got.flags.aligned, shape)
                self.assertTrue(same_array(got, v), shape)

    def test_encode_into_a_given_buffer(self):
        """encode(v, alloc) writes the same bytes into alloc's buffer, and
        decode(copy=False) of that buffer is a view of it."""
        for v in [np.arange(24, dtype=np.uint8).reshape(2, 3, 4), torch.arange(6, dtype=torch.uint8)]:
            dirty = np.full(1000, 0xFF, np.uint8)
            got = encode(v, lambda n: dirty[:n])
            self.assertEqual(got.__array_interface__["data"][0], dirty.__array_interface__["data"][0])
            self.assertEqual(bytes(got), bytes(encode(v)))
            view = decode(got, copy=False)
            view.reshape(-1)[0] = 7
            self.assertEqual(decode(got).reshape(-1)[0], 7, "no copy: the buffer's own bytes")
        frozen = encode(np.arange(8, dtype=np.uint8), lambda n: np.zeros(n, np.uint8))
        frozen.flags.writeable = False
        got = decode(frozen, copy=False)
        got[0] = 9  # a read-only buffer is copied, never handed out as writable
        self.assertEqual(decode(frozen)[0], 0)

    def test_the_batch_write_body_is_msgpack(self):
        """The batch write's body, sent piece by piece, is the msgpack of
        [{"index", "data"}], at every length's header width."""
        import msgpack

        from stallfree.client import _items_body
        for n, size in [(0, 0), (1, 0), (15, 255), (16, 256), (3, 65535), (2, 65536), (70000, 3), (1, 200_000)]:
            items = [(i * 1000, np.full(size, i % 250, np.uint8)) for i in range(n)]
            items[:1] = [(7, bytes(size)), (8, bytearray(size))][:min(n, 2)] if n else []
            want = msgpack.packb([{"index": i, "data": bytes(d)} for i, d in items], use_bin_type=True)
            self.assertEqual(b"".join(bytes(p) for p in _items_body(items)), want, (n, size))

    def test_names(self):
        self.assertEqual(derived_name("imgs", "decoded-224-v1"), "imgs.decoded-224-v1")
        odd = derived_name("imgs", "resize 224/crop")
        self.assertRegex(odd, r"^imgs\.[0-9a-f]{16}$")
        self.assertNotEqual(odd, derived_name("imgs", "resize 256/crop"))


class DecodeResizeTest(unittest.TestCase):
    """The image prep stage the package offers: the shorter side resized to
    `side`, the centre square kept, HWC uint8; a big JPEG decoded at a
    reduced DCT scale first."""

    def setUp(self):
        try:
            from PIL import Image  # noqa: F401
        except ImportError:
            self.skipTest("Pillow is not installed")

    @staticmethod
    def encoded(arr, fmt="JPEG"):
        import io

        from PIL import Image

        out = io.BytesIO()
        Image.fromarray(arr).save(out, fmt, **({"quality": 95} if fmt == "JPEG" else {}))
        return out.getvalue()

    @staticmethod
    def reference(raw, side):
        """The same steps at full scale, resizing the kept square only."""
        import io

        from PIL import Image

        im = Image.open(io.BytesIO(raw)).convert("RGB")
        w, h = im.size
        m = min(w, h)
        box = ((w - m) / 2, (h - m) / 2, (w + m) / 2, (h + m) / 2)
        return np.asarray(im.resize((side, side), Image.BILINEAR, box=box))

    def gradient(self, w, h):
        x, y = np.meshgrid(np.arange(w), np.arange(h))
        return np.stack([x * 255 // w, y * 255 // h, (x + y) * 255 // (w + h)], axis=-1).astype(np.uint8)

    def test_shape_and_pixels(self):
        import pickle

        from stallfree.prep import DecodeResize

        f = pickle.loads(pickle.dumps(DecodeResize(32)))  # as DataLoader workers get it
        # A wide PNG (no DCT scaling): exactly the reference. The left and
        # right thirds of the image are cut: the centre's colour survives.
        img = self.gradient(120, 40)
        img[:, :40], img[:, 80:] = 0, 255
        raw = self.encoded(img, "PNG")
        got = f(raw)
        self.assertEqual((got.shape, got.dtype), ((32, 32, 3), np.uint8))
        self.assertTrue(np.array_equal(got, self.reference(raw, 32)))
        self.assertTrue(np.array_equal(got, f(raw)), "deterministic")
        # A tall greyscale JPEG comes out RGB.
        grey = self.encoded(self.gradient(40, 100)[:, :, 0])
        self.assertEqual(f(grey).shape, (32, 32, 3))

    def test_big_jpeg_decoded_at_a_reduced_scale(self):
        import io

        from PIL import Image

        from stallfree.prep import DecodeResize

        raw = self.encoded(self.gradient(640, 480))
        im = Image.open(io.BytesIO(raw))
        im.draft("RGB", (43, 32))
        self.assertLess(im.size[0], 640, "this Pillow decodes a JPEG at a reduced scale")
        from PIL import JpegImagePlugin

        drafted, draft = [], JpegImagePlugin.JpegImageFile.draft

        def recording(im, mode, size, *rest):
            out = draft(im, mode, size, *rest)
            drafted.append((size, im.size))
            return out

        JpegImagePlugin.JpegImageFile.draft = recording
        try:
            got = DecodeResize(32)(raw).astype(int)
        finally:
            JpegImagePlugin.JpegImageFile.draft = draft
        self.assertEqual(len(drafted), 1)
        (asked, decoded), = drafted
        self.assertEqual(asked, (43, 32), "both sides at least 32, the aspect kept")
        self.assertEqual(decoded, (80, 60), "decoded at 1/8: the smallest scale that keeps 43x32")
        ref = self.reference(raw, 32).astype(int)
        self.assertLess(np.abs(got - ref).mean(), 4, "the reduced-scale decode resized as the full one")
        with self.assertRaises(ValueError):
            DecodeResize(0)


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

    def test_the_first_epoch_reads_the_parent_from_the_nodes_memory(self):
        """F's inputs in the first epoch are read as CachedDataset reads
        items: those resident on this host's node copied out of its memory,
        the rest (node 2's) by batch request. F's outputs exact, F once per
        item."""
        everything = list(range(len(self.keys)))
        Client(self.url1).batch("ds", everything)  # node 1's own items become resident
        ds = CachedDataset(self.url1, "ds", cache_stage=("map-v1", Stage(self.flog)))
        got = ds.__getitems__(everything)
        mapper = ds._mapper
        self.assertIsNotNone(mapper, "the parent was not read through the node's memory")
        self.assertGreater(mapper.copied, 0, "nothing copied from node 1's memory")
        self.assertLess(mapper.copied, len(everything), "node 2's items cannot be in node 1's memory")
        self.assertEqual(mapper.copied + mapper.fallbacks, len(everything))
        for i, x in enumerate(got):
            self.assertTrue(same_array(x, self.want[i]), f"item {i}")
        self.assert_f_once_per_item(lines(self.flog))

    def test_batch_loader(self):
        """BatchLoader's threads fetch whole minibatches through the same hook;
        in the first epoch a minibatch costs one request to learn what is
        written (batch?partial=1), one for the parent's bytes of the rest and
        one to write F's results (PUT batch), no request per item."""
        ds = CachedDataset(self.url2, "ds", transform=Transform(self.tlog), cache_stage=("bl-v1", Stage(self.flog)))
        n = len(self.keys)
        calls = []
        request = type(ds.client).request

        def counting(client, method, path, *a, **kw):
            calls.append((method, path.split("?")[0]))
            return request(client, method, path, *a, **kw)
        type(ds.client).request = counting
        self.addCleanup(setattr, type(ds.client), "request", request)
        for epoch in range(2):
            calls.clear()
            got = [x for batch in BatchLoader(ds, 8, threads=3, collate_fn=list) for x in batch]
            if epoch == 0:
                gets = [c for c in calls if c[0] == "GET" and "/index/" in c[1]]
                self.assertEqual(gets, [], "no item read one by one in the first epoch")
                sizes = [min(8, n - b) for b in range(0, n, 8)]
                self.assertEqual(sum(c[0] == "POST" and c[1].endswith("/batch") for c in calls), 2 * len(sizes),
                                 "two batch reads a minibatch: what is written, the parent's bytes")
                self.assertEqual(sum(c[0] == "PUT" and c[1].endswith("/batch") for c in calls),
                                 sum(k > 1 for k in sizes), "one batch write a minibatch")
                self.assertEqual(sum(c[0] == "PUT" and "/index/" in c[1] for c in calls), sum(k == 1 for k in sizes),
                                 "an item written on its own only when it is its minibatch's only one")
            self.assertEqual(len(got), n)
            for i, x in enumerate(got):
                self.assertTrue(same_array(x, self.want[i]), f"epoch {epoch} item {i}")
            self.assert_f_once_per_item(lines(self.flog))  # epoch 2 adds no call
        self.assertEqual(len(lines(self.tlog)), 2 * n)

    def test_big_results_are_written_from_reused_buffers(self):
        """F's results of 64 KiB and up are encoded into buffers reused once
        T is done with them (a fresh one an item was trimmed back to the
        kernel with its batch and faulted in again), and written from there:
        the same bytes are cached and returned."""
        def big(raw):
            return np.frombuffer(hashlib.sha256(raw).digest() * 2048, dtype=np.uint8).reshape(256, 256)

        ds = CachedDataset(self.url1, "ds", cache_stage=("big", big))
        where = lambda a: a.__array_interface__["data"][0]  # noqa: E731
        first = ds.__getitems__(list(range(8)))
        held = ds.__getitems__(list(range(8, 16)))
        self.assertEqual(set(map(where, first)) & set(map(where, held)), set(), "no buffer in use handed out again")
        self.assertTrue(all(same_array(x, big(self.files[self.keys[i]])) for i, x in enumerate(first + held)))
        used = set(map(where, first))
        del first
        again = ds.__getitems__(list(range(16, 24)))
        self.assertEqual(set(map(where, again)), used, "the first batch's buffers, once it was let go")
        self.assertTrue(all(same_array(x, big(self.files[self.keys[16 + i]])) for i, x in enumerate(again)))
        # One item alone (ds[i], a minibatch's only missing item) and a node
        # without batch writes: each result written on its own, from its buffer.
        self.assertTrue(same_array(ds[24], big(self.files[self.keys[24]])))
        self.assertTrue(same_array(ds.__getitems__([25])[0], big(self.files[self.keys[25]])))
        ds.client.put_items = lambda dataset, items: (_ for _ in ()).throw(StallfreeError(405, "method not allowed"))
        for i, x in enumerate(ds.__getitems__(list(range(26, 30)))):
            self.assertTrue(same_array(x, big(self.files[self.keys[26 + i]])), f"item {26 + i}, one by one")
        cached = CachedDataset(self.url2, "ds", cache_stage=("big", lambda raw: self.fail("F ran again")))
        for i, x in enumerate(cached.__getitems__(list(range(30)))):
            self.assertTrue(same_array(x, big(self.files[self.keys[i]])), f"item {i} as cached")

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
        # Two misses: one batch write, each item's 409 read back.
        self.assertTrue(all(same_array(x, first) for x in ds.__getitems__([5, 6])))

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

    def test_a_node_without_batch_writes(self):
        """A node that answers PUT …/batch 405 (one from before it) gets
        F's results one by one, from then on: the same items written, the
        same arrays returned."""
        ds = CachedDataset(self.url1, "ds", cache_stage=("old-node", Stage(self.flog)))
        client = ds.client
        tried = []

        def refused(dataset, items):
            tried.append(len(items))
            raise StallfreeError(405, "method not allowed")
        client.put_items = refused
        got = ds.__getitems__(list(range(8))) + ds.__getitems__(list(range(8, 16)))
        self.assertEqual(tried, [8], "asked once, then one by one")
        for i, x in enumerate(got):
            self.assertTrue(same_array(x, self.want[i]), f"item {i}")
        info = Client(self.url2).dataset(derived_name("ds", "old-node"))
        self.assertEqual(info["written"], 16)

    def test_batch_writes_split_by_bytes(self):
        """A minibatch's results go back in writes of at most
        ``max_write_bytes`` (a node refuses a body over its limit before
        reading it), an item larger than that alone."""
        self.assertEqual([[p[0] for p in run] for run in _chunks([(0, b"a" * 4), (1, b"b" * 4), (2, b"c" * 9),
                                                                    (3, b"d"), (4, b"e")], 8)],
                         [[0, 1], [2], [3, 4]])
        self.assertEqual(list(_chunks([], 8)), [])
        ds = CachedDataset(self.url1, "ds", cache_stage=("split-writes", Stage(self.flog)))
        ds.prep.max_write_bytes = 1  # every item on its own
        client = ds.client
        sent = []
        put_items = client.put_items

        def counting(dataset, items):
            sent.append(len(items))
            return put_items(dataset, items)
        client.put_items = counting
        got = ds.__getitems__(list(range(8)))
        self.assertEqual(sent, [1] * 8)
        for i, x in enumerate(got):
            self.assertTrue(same_array(x, self.want[i]), f"item {i}")
        self.assertEqual(Client(self.url2).dataset(derived_name("ds", "split-writes"))["written"], 8)

    def test_keys_and_labels(self):
        """with_key and labels with a prep stage: keys and labels right
        whether an item was written before (read back) or is computed now."""
        CachedDataset(self.url1, "ds", cache_stage=("keyed", pure_f)).__getitems__(list(range(0, 48, 2)))
        order = [5, 4, 31, 30, 47]
        keyed = CachedDataset(self.url2, "ds", with_key=True, cache_stage=("keyed", pure_f),
                              transform=lambda k, x: (k, x))
        got = keyed.__getitems__(order)
        self.assertEqual([k for k, _ in got], [self.keys[i] for i in order])
        self.assertTrue(all(same_array(x, self.want[i]) for (_, x), i in zip(got, order)))
        self.assertEqual(keyed[9][0], self.keys[9])
        folder = lambda k: int(k[1])  # noqa: E731 - c0/, c1/, c2/
        for labels in ("folder", folder):
            ds = CachedDataset(self.url1, "ds", cache_stage=("labelled", pure_f), labels=labels)
            got = ds.__getitems__(order) + [ds[6]]
            self.assertEqual([y for _, y in got], [folder(self.keys[i]) for i in order + [6]])
            self.assertTrue(all(same_array(x, self.want[i]) for (x, _), i in zip(got, order + [6])))


if __name__ == "__main__":
    unittest.main()
