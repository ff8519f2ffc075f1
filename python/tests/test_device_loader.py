"""DeviceLoader against real cachenode processes: batches byte-exact against
per-item reads (prep arrays, raw items, JPEGs), labels, augmentation by
sample index, a node killed mid-epoch, resume, and errors at construction."""

import io
import os
import shutil
import signal
import sys
import tempfile
import threading
import unittest
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from stallfree import Client, NodeUnreachable, StallfreeError  # noqa: E402
from stallfree.prep import PrepStage  # noqa: E402
from stallfree.torch import CachedDataset, DeviceLoader, LocalitySampler, StallMeter  # noqa: E402

from harness import Cluster, ClusterCase, TokenNodeCase, free_port, wait_until, without_cyclic_gc  # noqa: E402
from images import JPEGS  # noqa: E402

try:
    from stallfree.torch import augment as A
except ImportError:  # pragma: no cover - torchvision missing
    A = None

SHAPE = (12, 10, 3)


def hwc(raw):
    """The prep stage: an item's first 360 bytes as a (12, 10, 3) image."""
    return np.frombuffer(raw[:360], dtype=np.uint8).reshape(SHAPE)


def folder(key):
    return int(key[1])  # c0/, c1/, c2/


class FakeResponse:
    """What _Rows.read needs of an http.client response: a body of known
    length behind a buffered file of the given buffer size, or (length
    None, as a chunked answer) read through the response itself."""

    def __init__(self, body, buffer_size, known_length=True):
        self.fp = io.BufferedReader(io.BytesIO(body), buffer_size)
        self.chunked, self.length = not known_length, len(body) if known_length else None
        self.closed = False

    def read(self, n=-1):
        return self.fp.read(n)

    def readinto(self, b):
        return self.fp.readinto(b)

    def close(self):
        self.closed = True


class FramingTest(unittest.TestCase):
    """The batch answer's parser: the buffered fast path, the field-by-field
    path it falls back to, and a body of unknown length, all alike."""

    def test_paths_agree(self):
        import msgpack
        from stallfree.prep import encode
        from stallfree.torch.device import _Pool, _Rows

        rng = np.random.default_rng(2)
        arrays = [rng.integers(0, 256, SHAPE, dtype=np.uint8) for _ in range(9)]
        keys = [f"c{i % 3}/" + "k" * (5 + 60 * i) for i in range(9)]  # fixstr, str8 and longer (str16) keys
        body = msgpack.packb([{"key": k, "data": encode(a)} for k, a in zip(keys, arrays)], use_bin_type=True)
        pool = _Pool(pinned=False, keep=4)
        for buffer_size, known in ((8192, True), (16, True), (8192, False)):
            r = FakeResponse(body, buffer_size, known)
            rows, got_keys = _Rows(pool, 9, prep=True), [None] * 9
            rows.read(r, range(9), got_keys)
            self.assertTrue(np.array_equal(rows.tensor().numpy(), np.stack(arrays)), (buffer_size, known))
            self.assertEqual(got_keys, keys)
            self.assertEqual(r.closed, known, "a body of known length is released once read")
        cut = FakeResponse(body[:-100], 8192)
        cut.length = len(body)
        with self.assertRaises(ConnectionError):
            _Rows(pool, 9, prep=True).read(cut, range(9), None)


@unittest.skipIf(A is None, "no torchvision")
class BatchedDecodeTest(unittest.TestCase):
    """decode="jpeg" hands a whole batch to one decode_jpeg call where
    torchvision takes lists (0.19 on; on CUDA nvjpeg then decodes the batch
    as one), one call per image before, onto the loader's own device."""

    def decode_with(self, version, device):
        import types
        from unittest import mock
        import torchvision
        import torchvision.io
        from stallfree.torch.device import DeviceLoader as Loader

        calls = []

        def fake_decode_jpeg(data, mode, device):
            calls.append((data, mode, device))
            return [d + 1 for d in data] if isinstance(data, list) else data + 1

        images = [torch.full((3,), k, dtype=torch.uint8) for k in range(4)]
        loader = types.SimpleNamespace(_cuda=device.type == "cuda", device=device)
        with mock.patch.object(torchvision, "__version__", version), \
                mock.patch.object(torchvision.io, "decode_jpeg", fake_decode_jpeg):
            got = Loader._decode(loader, images)
        self.assertEqual([t.tolist() for t in got], [[k + 1] * 3 for k in range(4)])
        return calls

    def test_one_call_a_batch_where_lists_are_taken(self):
        from torchvision.io import ImageReadMode
        for version in ("0.19.0", "0.26.0+cu128", "1.0.0"):
            calls = self.decode_with(version, torch.device("cuda", 1))
            self.assertEqual(len(calls), 1, version)
            self.assertEqual(len(calls[0][0]), 4)
            self.assertEqual(calls[0][1:], (ImageReadMode.RGB, torch.device("cuda", 1)), "the loader's own GPU")

    def test_one_call_an_image_before(self):
        for version in ("0.14.1a0", "0.18.1+cpu", "unknown"):
            calls = self.decode_with(version, torch.device("cpu"))
            self.assertEqual(len(calls), 4, version)
            self.assertTrue(all(c[2] == "cpu" for c in calls))

    def test_a_cpu_loader_decodes_on_the_cpu(self):
        calls = self.decode_with("0.20.0", torch.device("cpu"))
        self.assertEqual([c[2] for c in calls], ["cpu"])


class DeviceLoaderTest(ClusterCase):
    def setUp(self):
        self.make_tmp("stallfree-dev")
        self.write_files(90, 11, lambda i: f"c{i % 3}/s{i:03d}.bin", 360, 1)
        self.cluster = Cluster(self.tmp, n=1)
        self.url = self.cluster.nodes[0][1]
        c = Client(self.url)
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")
        self.arrays = np.stack([hwc(self.files[k]) for k in self.keys])
        self.labels = np.array([folder(k) for k in self.keys])

    def prep_dataset(self):
        return CachedDataset(self.url, "ds", cache_stage=("hwc", hwc))

    def test_prep_batches_byte_exact_with_labels(self):
        ds = self.prep_dataset()
        computed = []
        get_many = PrepStage.get_many

        def counting(stage, client, indices, keys=False, **kw):
            computed.append(len(indices))
            return get_many(stage, client, indices, keys, **kw)
        PrepStage.get_many = counting
        self.addCleanup(setattr, PrepStage, "get_many", get_many)
        order = list(np.random.default_rng(1).permutation(90))
        for labels in ("folder", folder):
            computed.clear()
            loader = DeviceLoader(ds, 16, device="cpu", labels=labels, sampler=order, threads=2)
            self.assertEqual(len(loader), 6)
            got = list(loader)
            self.assertEqual([len(x) for x, _ in got], [16] * 5 + [10])
            for b, (x, y) in enumerate(got):
                idx = order[b * 16:(b + 1) * 16]
                self.assertEqual((x.dtype, tuple(x.shape[1:])), (torch.uint8, SHAPE))
                self.assertTrue(np.array_equal(x.numpy(), self.arrays[idx]), b)
                self.assertEqual(y.tolist(), self.labels[idx].tolist())
            if labels == "folder":
                self.assertEqual(sum(computed), 90, "the first epoch computes every item")
            else:
                self.assertEqual(computed, [], "later epochs stream the written arrays")
                # ... copied from the node's mapped memory, keys (for the
                # labels) included: nothing through the socket.
                self.assertEqual((loader._mapper.copied, loader._mapper.fallbacks), (90, 0))

    def test_the_first_epoch_runs_F_on_a_batchs_items_side_by_side(self):
        """With one batch thread, F's calls meet two at a time at a barrier:
        they run in fill_threads, not one after the other (which would
        break the barrier at its timeout and fail the batch)."""
        met = threading.Barrier(2, timeout=30)
        threads, lock = [], threading.Lock()

        def paired(raw):
            met.wait()
            with lock:
                threads.append(threading.current_thread().name)
            return hwc(raw)

        ds = CachedDataset(self.url, "ds", cache_stage=("hwc-paired", paired))
        loader = DeviceLoader(ds, 10, device="cpu", threads=1, prefetch=1, fill_threads=2)
        got = torch.cat([x for x, _ in loader])
        self.assertTrue(np.array_equal(got.numpy(), self.arrays))
        self.assertEqual(len(threads), 90, "F once per item")
        self.assertTrue(all(n.startswith("stallfree-fill") for n in threads), set(threads))
        self.assertEqual(len(set(threads)), 2)
        # F's threads end with the pass that made them.
        self.assertIsNone(loader._fill)
        wait_until(lambda: not any(t.name.startswith("stallfree-fill") for t in threading.enumerate()), 30,
                   "the fill threads to end")
        # Written: the next epoch computes nothing, and meets no barrier.
        met.abort()
        self.assertTrue(np.array_equal(torch.cat([x for x, _ in loader]).numpy(), self.arrays))
        self.assertEqual(len(threads), 90)
        with self.assertRaises(ValueError):
            DeviceLoader(ds, 10, device="cpu", fill_threads=0)
        # By default, a thread for each CPU the process may run on, shared
        # among the host's local ranks, at most 32.
        from stallfree.torch.device import _fill_threads
        cpus = len(os.sched_getaffinity(0))
        self.assertEqual(DeviceLoader(ds, 10, device="cpu").fill_threads, min(32, cpus))
        self.assertEqual(_fill_threads({"LOCAL_WORLD_SIZE": "2"}), max(1, min(32, cpus // 2)))
        self.assertEqual(_fill_threads({"LOCAL_WORLD_SIZE": str(cpus * 4)}), 1)
        self.assertEqual(_fill_threads({"LOCAL_WORLD_SIZE": "two"}), min(32, cpus))

    def test_fill_threads_with_pooled_outputs_and_an_F_that_fails(self):
        """F's outputs of 64 KiB or more are encoded into pooled buffers,
        here from four threads at once: every batch byte-exact, the first
        epoch's and the next. An F that raises fails its batch in the loop,
        and none of that batch's items is written."""
        def big(raw):
            return np.resize(hwc(raw), (96, 256, 3))  # 72 KiB: pooled (REUSE_FROM)

        want = np.stack([big(self.files[k]) for k in self.keys])
        loader = DeviceLoader(CachedDataset(self.url, "ds", cache_stage=("big", big)), 16, device="cpu", threads=2,
                              fill_threads=4)
        for epoch in range(2):
            self.assertTrue(np.array_equal(torch.cat([x for x, _ in loader]).numpy(), want), epoch)

        # A pass stopped early ends its fill threads too; the next pass
        # computes what the first left and is byte-exact.
        ds = CachedDataset(self.url, "ds", cache_stage=("big-early", big))
        loader = DeviceLoader(ds, 16, device="cpu", threads=2, fill_threads=4)
        for x, _ in loader:
            self.assertTrue(np.array_equal(x.numpy(), want[:16]))
            break
        wait_until(lambda: not any(t.name.startswith("stallfree-fill") for t in threading.enumerate()), 30,
                   "the fill threads of the stopped pass to end")
        self.assertTrue(np.array_equal(torch.cat([x for x, _ in loader]).numpy(), want))

        bad = self.files[self.keys[5]]

        def boom(raw):
            if raw == bad:
                raise ValueError("F refuses item 5")
            return hwc(raw)

        ds = CachedDataset(self.url, "ds", cache_stage=("boom", boom))
        with self.assertRaisesRegex(ValueError, "F refuses item 5"):
            for _ in DeviceLoader(ds, 10, device="cpu", threads=1, prefetch=1, fill_threads=3):
                pass
        self.assertEqual(ds.prep.written_many(ds.client, list(range(10))), [None] * 10)

    def test_buffers_are_reused_only_when_free(self):
        loader = DeviceLoader(self.prep_dataset(), 30, device="cpu", threads=1, prefetch=1)
        list(loader)  # writes the prep items
        held = [x for x, _ in loader]  # every batch kept: none may be overwritten
        self.assertTrue(np.array_equal(np.concatenate([x.numpy() for x in held]), self.arrays))
        ptrs = set()
        with without_cyclic_gc():  # a buffer a cycle kept would not come back
            for _ in range(3):
                for x, _ in loader:
                    ptrs.add(x.data_ptr())
                    del x
        self.assertLessEqual(len(ptrs), 4, "dropped batches' buffers are used again")

    def test_raw_items_of_one_size(self):
        loader = DeviceLoader(CachedDataset(self.url, "ds"), 32, device="cpu", shuffle=True, seed=3)
        loader.set_epoch(2)
        order = list(loader._indices())
        got = torch.cat([x for x, y in loader])
        self.assertEqual(tuple(got.shape), (90, 360))
        self.assertEqual([bytes(r) for r in got.numpy()], [self.files[self.keys[i]] for i in order])

    @unittest.skipIf(A is None, "no torchvision")
    def test_jpeg_items_come_packed_in_one_reused_buffer(self):
        """decode="jpeg": the items the node on this host holds reach the
        decode as views of one pooled buffer a batch, one after the other,
        and the buffers are used again batch after batch (a bytes object
        and a bytearray per item cost 55 page faults a sample on the H200's
        VM); items not yet resident come as copies of their own. Every
        item byte-exact."""
        loader = DeviceLoader(CachedDataset(self.url, "ds"), 30, device="cpu", decode="jpeg", threads=1, prefetch=1)
        seen = []

        def decode(data):
            seen.append([(t.data_ptr(), bytes(t.numpy())) for t in data])
            return [t.clone() for t in data]
        loader._decode = decode
        want = [self.files[k] for k in self.keys]
        firsts = set()
        with without_cyclic_gc():  # a buffer a cycle kept would not come back
            for epoch in range(4):
                del seen[:]
                for x, _ in loader:
                    del x
                self.assertEqual([b for batch in seen for _, b in batch], want, epoch)
                if epoch == 0:
                    continue  # the items become resident as this epoch reads them
                for batch in seen:
                    ptrs = [p for p, _ in batch]
                    self.assertEqual(ptrs, [ptrs[0] + sum(len(b) for _, b in batch[:k]) for k in range(len(batch))],
                                     "one buffer, items one after the other")
                    firsts.add(ptrs[0])
        self.assertEqual(loader.dataset._mapper.copied, 3 * 90)
        self.assertLessEqual(len(firsts), 4, "dropped batches' buffers are used again")
        # Every third item's pages "freed" between the answer and the copy's
        # end: read again through the socket, still exact.
        m, moved = loader.dataset._mapper._map, {}
        real = m.gen_sum

        def gen_sum(off, size, page):
            moved.setdefault(off, len(moved) % 3 == 0)
            return real(off, size, page) + (1 if moved[off] else 0)
        m.gen_sum = gen_sum
        del seen[:]
        for x, _ in loader:
            del x
        self.assertEqual([b for batch in seen for _, b in batch], want)
        self.assertEqual(loader.dataset._mapper.copied, 3 * 90 + 60)

    def test_items_copied_from_the_nodes_memory(self):
        """Resident items are copied from the node's mapped arena; those not
        resident, or whose pages' generations moved while they were copied,
        come through the socket, and every batch stays byte-exact."""
        loader = DeviceLoader(CachedDataset(self.url, "ds"), 32, device="cpu", threads=1)
        want = [self.files[k] for k in self.keys]
        for epoch, (copied, fallbacks) in enumerate(((0, 90), (90, 90))):
            got = torch.cat([x for x, y in loader])
            self.assertEqual([bytes(r) for r in got.numpy()], want, epoch)
            self.assertEqual((loader._mapper.copied, loader._mapper.fallbacks), (copied, fallbacks), epoch)
        # Every third item's pages "freed" between the answer and the copy's end.
        m = loader._mapper._map
        real = m.gen_sum
        moved = {}

        def gen_sum(off, size, page):
            moved.setdefault(off, len(moved) % 3 == 0)
            return real(off, size, page) + (1 if moved[off] else 0)
        m.gen_sum = gen_sum
        got = torch.cat([x for x, y in loader])
        self.assertEqual([bytes(r) for r in got.numpy()], want)
        self.assertEqual((loader._mapper.copied, loader._mapper.fallbacks), (90 + 60, 90 + 30))

    def test_streamed_answers_keep_the_connection(self):
        from stallfree.torch.device import _Pool, _Rows
        c = Client(self.url)
        pool, socks = _Pool(pinned=False, keep=2), set()
        for start in (0, 30, 60):
            rows = _Rows(pool, 30, prep=False)
            c.batch_into("ds", range(start, start + 30), lambda r, pos: rows.read(r, pos, None))
            self.assertEqual([bytes(b) for b in rows.tensor().numpy()],
                             [self.files[k] for k in self.keys[start:start + 30]])
            socks.add(id(c._local.conns[c.urls[0]].sock))
        self.assertEqual(len(socks), 1, "one connection for every batch")

    @unittest.skipIf(A is None, "torchvision is not installed")
    def test_augment_by_sample_index_and_epoch(self):
        aug = A.Compose([A.RandomResizedCrop(8), A.RandomHorizontalFlip(), A.Normalize([0.5] * 3, [0.25] * 3)],
                        dtype=torch.bfloat16)
        ds = self.prep_dataset()
        order = list(range(89, -1, -1))
        loader = DeviceLoader(ds, 16, device="cpu", augment=aug, sampler=order, seed=5)
        loader.set_epoch(3)
        got = torch.cat([x for x, _ in loader])
        self.assertEqual((tuple(got.shape), got.dtype), ((90, 3, 8, 8), torch.bfloat16))
        self.assertTrue(got.is_contiguous(memory_format=torch.channels_last))
        want = aug(torch.from_numpy(self.arrays[order]), np.array(order), epoch=3, seed=5)
        self.assertTrue(torch.equal(got, want))

    @unittest.skipUnless(torch.cuda.is_available() and A is not None, "no CUDA device (or no torchvision)")
    def test_cuda(self):
        ds = self.prep_dataset()
        list(DeviceLoader(ds, 30, device="cpu"))  # writes the prep items
        got = [(x.cpu(), y.cpu()) for x, y in DeviceLoader(ds, 16, device="cuda", labels="folder", prefetch=3)]
        self.assertTrue(np.array_equal(torch.cat([x for x, _ in got]).numpy(), self.arrays))
        self.assertEqual(torch.cat([y for _, y in got]).tolist(), self.labels.tolist())
        aug = A.Compose([A.RandomResizedCrop(8), A.RandomHorizontalFlip(), A.Normalize([0.5] * 3, [0.25] * 3)])
        on_cpu = torch.cat([x for x, _ in DeviceLoader(ds, 16, device="cpu", augment=aug, seed=2)])
        # Copied and augmented in the reading threads on their own streams
        # (the default), and on the step's stream in the loop's thread.
        for side in (True, False):
            loader = DeviceLoader(ds, 16, device="cuda", augment=aug, labels="folder", seed=2)
            loader._side_streams = side
            got = [(x.clone(), y.clone()) for x, y in loader]  # clones on the loop's stream, after its wait
            torch.testing.assert_close(torch.cat([x for x, _ in got]).cpu(), on_cpu, rtol=0, atol=1e-4)
            self.assertEqual(torch.cat([y for _, y in got]).tolist(), self.labels.tolist())

    def test_resume_and_stall_meter(self):
        c = Client(self.url)
        c.json("PUT", "/v1/jobs/j", {"dataset": "ds", "seed": 1, "world_size": 1, "batch_size": 16})
        sampler = LocalitySampler(self.url, "j", 0)
        sampler.set_epoch(0)
        order = list(sampler)
        loader = DeviceLoader(self.prep_dataset(), 16, device="cpu", sampler=sampler, labels="folder", prefetch=3)
        for b, (x, y) in enumerate(loader):
            if b == 2:
                state = loader.state_dict()
                break
        self.assertEqual(state["position"], 48, "what the loop received, not what was prefetched")
        again = LocalitySampler(self.url, "j", 0)
        again.load_state_dict(state)
        again.set_epoch(state["epoch"])
        rest = DeviceLoader(self.prep_dataset(), 16, device="cpu", sampler=again, labels="folder")
        meter = StallMeter(self.url, rest, job="j")
        got = list(meter)
        self.assertTrue(np.array_equal(torch.cat([x for x, _ in got]).numpy(), self.arrays[order[48:]]))
        self.assertEqual(torch.cat([y for _, y in got]).tolist(), self.labels[order[48:]].tolist())
        self.assertEqual((meter.batches, meter.items), (3, 42), "the meter counts (x, y) batches by x")

    def test_jpeg_decoding_matches_pillow(self):
        from PIL import Image
        jpg = os.path.join(self.tmp, "jpg")
        want = {}
        for k in range(12):
            name, data = JPEGS[k % len(JPEGS)]
            key = f"c{k % 2}/{k:02d}-{name}"
            os.makedirs(os.path.join(jpg, os.path.dirname(key)), exist_ok=True)
            with open(os.path.join(jpg, key), "wb") as f:
                f.write(data)
            want[key] = np.asarray(Image.open(io.BytesIO(data)).convert("RGB")).transpose(2, 0, 1)
        c = Client(self.url)
        wait_until(lambda: c.json("PUT", "/v1/datasets/jpg", {"source": jpg}), 30, "registration")
        keys = sorted(want)
        ds = CachedDataset(self.url, "jpg")
        got = [x for xs, _ in DeviceLoader(ds, 5, device="cpu", decode="jpeg") for x in xs]
        self.assertEqual(len(got), 12)
        for x, k in zip(got, keys):
            self.assertEqual(tuple(x.shape), want[k].shape, k)
            diff = np.abs(x.numpy().astype(int) - want[k].astype(int))
            self.assertLessEqual(diff.max(), 2, k)
        if A is not None:
            loader = DeviceLoader(ds, 5, device="cpu", decode="jpeg", labels="folder", augment=A.RandomResizedCrop(16))
            xs, ys = zip(*loader)
            self.assertEqual([tuple(x.shape) for x in xs], [(5, 3, 16, 16), (5, 3, 16, 16), (2, 3, 16, 16)])
            self.assertEqual(torch.cat(ys).tolist(), [int(k[1]) for k in keys])

    def test_bad_url_dataset_and_arguments_fail_at_construction(self):
        port = free_port()
        with self.assertRaises(NodeUnreachable) as e:
            DeviceLoader(CachedDataset(f"http://127.0.0.1:{port}", "ds"), 8, device="cpu")
        self.assertIn(f"127.0.0.1:{port}", str(e.exception))
        with self.assertRaises(StallfreeError) as e:
            CachedDataset(self.url, "nope")
        self.assertEqual(e.exception.status, 404)
        ds = CachedDataset(self.url, "ds")
        with self.assertRaises(ValueError):
            DeviceLoader(ds, 8, device="cpu", decode="png")
        with self.assertRaises(ValueError):
            DeviceLoader(CachedDataset(self.url, "ds", transform=len), 8, device="cpu")
        ds.client.json("DELETE", "/v1/datasets/ds")
        with self.assertRaises(StallfreeError) as e:
            DeviceLoader(ds, 8, device="cpu")
        self.assertEqual(e.exception.status, 404)
        self.assertIn("DeviceLoader: dataset 'ds'", str(e.exception))


class TokenTest(TokenNodeCase):
    """A wrong token stops DeviceLoader at construction, naming the node."""

    token = "dev-token"

    def test_wrong_token(self):
        c = Client(self.url, token="dev-token")
        wait_until(lambda: c.json("PUT", "/v1/datasets/t", {"source": os.path.join(self.tmp, "data")}), 30, "node")
        ds = CachedDataset(self.url, "t", token="dev-token")
        x, y = next(iter(DeviceLoader(ds, 1, device="cpu")))
        self.assertEqual(bytes(x.numpy()[0]), b"abc" * 100)
        self.assertIsNone(y)
        ds.token, ds._client = "wrong", None
        with self.assertRaises(StallfreeError) as e:
            DeviceLoader(ds, 1, device="cpu")
        self.assertEqual(e.exception.status, 401)
        self.assertIn("refused the token", str(e.exception))
        self.assertIn(self.url, str(e.exception))


class NodeKilledTest(ClusterCase):
    """A node killed mid-epoch under DeviceLoader on 3 nodes, owner-routed:
    every batch still arrives, byte-exact (the dead node's prep items are
    computed again)."""

    def setUp(self):
        self.make_tmp("stallfree-devkill")
        self.write_files(240, 9, lambda i: f"c{i % 3}/s{i:04d}.bin", 360, 1)
        self.cluster = Cluster(self.tmp, n=3)
        self.url = self.cluster.nodes[0][1]
        c = Client(self.url)
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")

    def test_owner_killed_mid_epoch(self):
        ds = CachedDataset(self.url, "ds", route="owner", cache_stage=("hwc", hwc))
        self.assertEqual(len(set(ds.client.owners("ds")["owners"])), 3, "every node owns some items")
        order = list(range(1, 240, 2)) + list(range(0, 240, 2))
        loader = DeviceLoader(ds, 24, device="cpu", sampler=order, labels="folder", threads=3, prefetch=3)
        list(loader)  # the first epoch writes every prep item at its owner
        want = np.stack([hwc(self.files[k]) for k in self.keys])[order]
        got = []
        for b, (x, y) in enumerate(loader):
            if b == 3:
                victim = self.cluster.procs[2]
                victim.send_signal(signal.SIGKILL)
                victim.wait()
            got.append((x.numpy().copy(), y.tolist()))
        self.assertEqual([len(x) for x, _ in got], [24] * 10)
        self.assertTrue(np.array_equal(np.concatenate([x for x, _ in got]), want))
        self.assertEqual([v for _, y in got for v in y], [folder(self.keys[i]) for i in order])


if __name__ == "__main__":
    unittest.main()


class ItemMapperTest(unittest.TestCase):
    """ItemMapper.read against files standing in for a node's arena and
    generations: items copied from where the answer says, an item whose
    bytes were reused while read (its generation moved) left to the socket,
    and the same garbage with its generation unmoved an error."""

    def setUp(self):
        from stallfree.prep import encode

        self.tmp = tempfile.mkdtemp(prefix="stallfree-mapper")
        self.addCleanup(shutil.rmtree, self.tmp)
        rng = np.random.default_rng(3)
        self.arrays = [rng.integers(0, 256, SHAPE, dtype=np.uint8) for _ in range(2)]
        items = [encode(a) for a in self.arrays]
        page = 4096
        self.places = [(0, len(items[0])), (page, len(items[1]))]  # one page each
        self.arena = os.path.join(self.tmp, "arena")
        with open(self.arena, "wb") as f:
            f.truncate(2 * page)
            for (off, _), b in zip(self.places, items):
                f.seek(off)
                f.write(b)
        self.gens = os.path.join(self.tmp, "gens")
        with open(self.gens, "wb") as f:
            f.write(np.array([5, 9], dtype="<u4").tobytes())

    def read(self, keys=None, gap=False):
        from stallfree._mapped import ItemMapper
        from stallfree.torch.device import _Pool, _Rows

        m = ItemMapper(Client.__new__(Client), "/nonexistent")
        items = [[off, size, g, f"c0/k{i}"] for i, ((off, size), g) in enumerate(zip(self.places, (5, 9)))]
        if gap:  # a row between them that the node does not hold
            items.insert(1, None)
        answer = {"arena": self.arena, "gens": self.gens, "size": 8192, "page": 4096, "items": items}
        m._locate = lambda name, indices: answer
        rows = _Rows(_Pool(pinned=False, keep=2), len(items), True)
        return m, rows, m.read("ds", list(range(len(items))), rows, keys, True)

    def test_rows_around_an_unheld_item(self):
        """The rows on either side of a row left to the socket are copied
        (with torch: one copy per run of consecutive rows; without, one per
        item), and the row between them is left to the socket."""
        for torch_loaded in (True, False):
            with mock.patch.dict(sys.modules, {} if torch_loaded else {"torch": None}):
                m, rows, left = self.read(gap=True)
            self.assertEqual((left, m.copied, m.fallbacks), ([1], 2, 1), torch_loaded)
            got = rows.array()
            self.assertTrue(np.array_equal(got[0], self.arrays[0]), torch_loaded)
            self.assertTrue(np.array_equal(got[2], self.arrays[1]), torch_loaded)

    def set_gen(self, page, value):
        with open(self.gens, "r+b") as f:
            f.seek(4 * page)
            f.write(np.array([value], dtype="<u4").tobytes())

    def spoil(self, i):
        with open(self.arena, "r+b") as f:
            f.seek(self.places[i][0])
            f.write(b"garbage!" * 4)

    def test_copied_where_the_answer_says(self):
        keys = [None, None]
        m, rows, left = self.read(keys)
        self.assertEqual((left, m.copied, m.fallbacks), ([], 2, 0))
        self.assertTrue(np.array_equal(rows.array(), np.stack(self.arrays)))
        self.assertEqual(keys, ["c0/k0", "c0/k1"])

    def test_reused_while_read_goes_to_the_socket(self):
        self.spoil(1)
        self.set_gen(1, 10)  # freed (and reused) since the node answered
        m, rows, left = self.read()
        self.assertEqual((left, m.copied, m.fallbacks), ([1], 1, 1))
        self.assertTrue(np.array_equal(rows.array()[0], self.arrays[0]))

    def test_garbage_with_its_generation_unmoved_is_an_error(self):
        self.spoil(1)
        with self.assertRaises(ValueError):
            self.read()
