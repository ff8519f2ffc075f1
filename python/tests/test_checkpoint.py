"""Checkpointer against a real two-node cluster: a model and its Adam state
saved while training goes on, loaded back exactly as they were at save()."""

import copy
import fractions
import os
import pickle
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from harness import BIN, Cluster, ClusterCase, wait_until  # noqa: E402

from stallfree import Client, StallfreeError  # noqa: E402
from stallfree.checkpoint import Checkpointer, part_names  # noqa: E402

try:
    import torch
except ImportError:  # the checkpoint tests need torch; the rest of the suite does not
    torch = None


def model_and_optimizer(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, opt


def train_step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def tensors(obj, prefix=""):
    """Every tensor in a nested state, by path."""
    if torch.is_tensor(obj):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors(v, f"{prefix}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensors(v, f"{prefix}/{i}")


class GatedCheckpointer(Checkpointer):
    """Holds every upload until the test opens the gate, so the training
    loop's next step certainly runs before the save's Future resolves."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.gate = threading.Event()

    def _upload(self, *a):
        self.gate.wait(60)
        return super()._upload(*a)


@unittest.skipIf(torch is None, "needs torch")
class CheckpointTest(ClusterCase):
    def setUp(self):
        self.make_tmp("sf-ckpt-")
        self.cluster = Cluster(self.tmp, n=2)
        self.url = self.cluster.nodes[0][1]

    def assertStatesEqual(self, got, want):
        g, w = dict(tensors(got)), dict(tensors(want))
        self.assertEqual(sorted(g), sorted(w))
        self.assertTrue(w, "the state has tensors")
        for k in w:
            self.assertTrue(torch.equal(g[k], w[k]), f"tensor {k} differs")

    def test_round_trip_while_training(self):
        model, opt = model_and_optimizer(1)
        for i in range(3):
            train_step(model, opt, i)
        ck = GatedCheckpointer(self.url, "job")
        self.assertIsNone(ck.load(), "nothing committed yet")
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": 3}
        want = copy.deepcopy(state)
        fut = ck.save(3, state, meta={"epoch": 0})
        self.assertFalse(fut.done())
        train_step(model, opt, 3)  # the next optimizer step, before the Future resolves
        moved = [k for k, t in tensors(model.state_dict()) if not torch.equal(t, dict(tensors(want["model"]))[k])]
        self.assertTrue(moved, "the step after save() changed the weights")
        ck.gate.set()
        info = fut.result(60)
        self.assertEqual(info["step"], 3)
        self.assertEqual(info["replicas"], 2)
        # Loaded through the other node too (once its catalog has the commit):
        # any copy serves.
        other = Checkpointer(self.cluster.nodes[1][1], "job")
        wait_until(lambda: other.steps(), 10, "the commit reaching the other node")
        for url in (self.url, self.cluster.nodes[1][1]):
            got = Checkpointer(url, "job").load(map_location="cpu")
            self.assertStatesEqual(got, want)
            self.assertEqual(got["step"], 3)
        # The loaded state resumes training: the same next step as the original.
        model2, opt2 = model_and_optimizer(99)
        got = ck.load()
        model2.load_state_dict(got["model"])
        opt2.load_state_dict(got["opt"])
        train_step(model2, opt2, 3)
        self.assertStatesEqual(model2.state_dict(), model.state_dict())
        ck.close()

    def test_ranks_split_parts_and_newest_by_default(self):
        # Two ranks on two nodes; rank 1's state is split into 1 MiB parts.
        states = {r: {"w": torch.arange(300_000 * (r + 1), dtype=torch.float32) + r} for r in range(2)}
        cks = [Checkpointer(self.cluster.nodes[r][1], "ddp", rank=r, world_size=2, part_bytes=1 << 20) for r in range(2)]
        for step in (10, 20):
            futs = [cks[r].save(step, {"w": states[r]["w"] + step}) for r in (1, 0)]
            for f in futs:
                self.assertEqual(f.result(60)["step"], step)
        listing = Client(self.url).json("GET", "/v1/checkpoints/ddp")
        self.assertEqual(listing["latest"], 20)
        parts = listing["steps"][-1]["parts"]
        self.assertIn("0.0-of-2", parts)
        self.assertEqual(sorted(p for p in parts if p.startswith("1.")), sorted(part_names(1, 3)))
        for r in range(2):
            self.assertTrue(torch.equal(cks[r].load()["w"], states[r]["w"] + 20))
            self.assertTrue(torch.equal(cks[r].load(step=10)["w"], states[r]["w"] + 10))
        with self.assertRaises(KeyError):
            cks[0].load(step=5)
        # torch.load's own arguments pass through: weights_only refuses an
        # object it does not know (torch >= 2.6's default), and False loads it.
        futs = [cks[r].save(30, {"w": states[r]["w"], "ratio": fractions.Fraction(1, 3)}) for r in (1, 0)]
        for f in futs:
            f.result(60)
        with self.assertRaises(pickle.UnpicklingError):
            cks[0].load(weights_only=True)
        self.assertEqual(cks[0].load(weights_only=False)["ratio"], fractions.Fraction(1, 3))
        for c in cks:
            c.close()

    @unittest.skipUnless(os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK),
                         "the nodes' default --shm-dir, /dev/shm, is not writable here")
    def test_load_maps_the_local_copy(self):
        """On the node's host, load() maps the node's own copies of a rank's
        parts (shared memory, GET ?map=1 over its socket) and reads nothing
        over a socket; a dropped step's files go with it."""
        state = {"w": torch.arange(700_000, dtype=torch.float32)}  # 2.8 MB: three 1 MiB parts
        ck = Checkpointer(self.url, "mapped", part_bytes=1 << 20)
        for step in (1, 2):
            ck.save(step, {"w": state["w"] + step}).result(60)

        def no_fetch(*a, **kw):
            raise AssertionError("a part was fetched, not mapped")
        reader = Checkpointer(self.url, "mapped")
        reader._fetch = no_fetch
        self.assertTrue(torch.equal(reader.load()["w"], state["w"] + 2))
        self.assertTrue(torch.equal(reader.load(step=1)["w"], state["w"] + 1))
        parts = sorted(Client(self.url).json("GET", "/v1/checkpoints/mapped")["steps"][0]["parts"])
        sizes = {p: 0 for p in parts}
        sizes.update({p["part"]: p["bytes"] for p in
                      Client(self.url).json("GET", "/v1/checkpoints/mapped/steps/1/parts")["parts"]})
        # Over TCP, or for a part not held, there is nothing to map: 204,
        # nothing sent.
        tcp = Client(self.url, use_socket=False)
        for path in (f"/v1/checkpoints/mapped/steps/1/parts/{parts[0]}?map=1",
                     "/v1/checkpoints/mapped/steps/1/parts/9?map=1"):
            r, body = tcp.request("GET", path)
            self.assertEqual((r.status, body, r.getheader("X-Checkpoint-Map")), (204, b"", None), path)
        maps = reader._map_local(1, parts, sizes)
        self.assertEqual(len(maps), 3)
        self.assertTrue(all(m is not None for m in maps), "every part of step 1 mapped")
        for m in maps:
            m.close()
        # The answer names the file's device and inode, and a file of the
        # same name and size that is not it (another user's, put there after
        # the node dropped the part) is not mapped: torch.load would unpickle
        # it.
        r, _ = Client(self.url).request("GET", f"/v1/checkpoints/mapped/steps/1/parts/{parts[0]}?map=1")
        path, size = r.getheader("X-Checkpoint-Map"), int(r.getheader("X-Checkpoint-Map-Size"))
        st = os.stat(path)
        self.assertEqual((int(r.getheader("X-Checkpoint-Map-Dev")), int(r.getheader("X-Checkpoint-Map-Ino"))),
                         (st.st_dev, st.st_ino))
        from stallfree.checkpoint import _map_readonly
        planted = os.path.join(self.tmp, "planted")
        with open(planted, "wb") as f:
            f.write(b"\0" * size)
        self.assertIsNone(_map_readonly(planted, size, (st.st_dev, st.st_ino)), "another file under the name")
        m = _map_readonly(path, size, (st.st_dev, st.st_ino))
        self.assertIsNotNone(m, "the node's own file")
        m.close()
        # The node's files themselves: step 1's are removed once
        # --checkpoint-keep 2 drops it, and only then.
        import glob
        files = set(glob.glob("/dev/shm/stallfree-ckpt-py1-*"))
        self.assertGreaterEqual(len(files), 6, "steps 1 and 2 in shared memory")
        ck.save(3, {"w": state["w"] + 3}).result(60)
        wait_until(lambda: [s["step"] for s in Client(self.url).json("GET", "/v1/checkpoints/mapped")["steps"]] == [2, 3],
                   10, "step 1 dropped")
        wait_until(lambda: len(files - set(glob.glob("/dev/shm/stallfree-ckpt-py1-*"))) == 3, 10,
                   "the three handed-out files of step 1 removed")
        self.assertTrue(torch.equal(reader.load()["w"], state["w"] + 3))
        ck.close()

    def test_checksum_algorithms(self):
        """crc32c by default where it is fast (here: the crc32c module
        installed, taken as fast, so that its sums meet the node's), sha256
        on request; named per part in the listing; a wrong value of each
        kind stores nothing."""
        import stallfree.checkpoint as ckmod
        state = {"w": torch.arange(100_000, dtype=torch.float32)}
        algos = ("sha256",) if ckmod._crc32c() is None else ("crc32c", "sha256")
        saved = ckmod._fast_crc32c
        ckmod._fast_crc32c = ckmod._crc32c
        try:
            for algo in algos:
                ck = Checkpointer(self.url, "sum-" + algo, checksum=algo)
                self.assertEqual(ck.checksum, algo)
                ck.save(1, state).result(60)
                step = Client(self.url).json("GET", f"/v1/checkpoints/sum-{algo}")["steps"][-1]
                self.assertEqual([c["checksum"] for c in step["checksums"]], [algo])
                self.assertTrue(torch.equal(ck.load()["w"], state["w"]))
                ck.close()
            self.assertEqual(Checkpointer(self.url, "default").checksum, algos[0])
        finally:
            ckmod._fast_crc32c = saved
        body = b"x" * 1000
        client = Client(self.url)
        for wrong in ("crc32c:00000000", "sha256:" + "0" * 64, "0" * 64, "crc32c:XYZ", "md5:" + "0" * 32):
            with self.assertRaises(StallfreeError) as e:
                client.request("PUT", "/v1/checkpoints/bad/steps/1/parts/0", body=body,
                               headers={"X-Checksum": wrong, "Content-Type": "application/octet-stream"})
            self.assertEqual(e.exception.status, 400, wrong)
        self.assertEqual(client.json("GET", "/v1/checkpoints/bad/steps/1/parts")["parts"], [])
        with self.assertRaises(ValueError):
            Checkpointer(self.url, "x", checksum="md5")

    def test_auto_interval_and_cachectl(self):
        ck = Checkpointer(self.url, "auto")
        state = {"w": torch.randn(2_000_000)}
        ck.save(1, state).result(60)
        step_time = 0.05
        k = ck.auto(step_time)
        self.assertGreaterEqual(k, 1)
        self.assertLessEqual(ck.overhead(step_time), 0.035 + 1e-9)
        self.assertGreaterEqual(k * step_time, ck.upload_seconds)
        self.assertIsNone(ck.maybe_save(k + 1, state) if k > 1 else None)
        ck.close()
        ctl = os.path.join(os.path.dirname(BIN), "cachectl")
        out = subprocess.run([ctl, "--node", self.url, "checkpoints", "ls"], capture_output=True, text=True, check=True).stdout
        self.assertIn("auto", out)
        subprocess.run([ctl, "--node", self.url, "checkpoints", "rm", "auto"], check=True)
        self.assertEqual(ck.steps(), [])


class ChecksumFallbackTest(unittest.TestCase):
    def test_sha256_without_crc32c_said_once(self):
        import warnings
        import stallfree.checkpoint as ckmod
        saved = ckmod._crc32c, list(ckmod._warned_no_crc32c)
        ckmod._crc32c, ckmod._warned_no_crc32c[:] = (lambda: None), []
        try:
            with warnings.catch_warnings(record=True) as w:
                warnings.simplefilter("always")
                self.assertEqual(ckmod._checksum_algo("crc32c"), "sha256")
                self.assertEqual(ckmod._checksum_algo("crc32c"), "sha256")
            self.assertEqual(len([x for x in w if "crc32c" in str(x.message)]), 1)
            self.assertIsNone(ckmod._Summer.for_header("crc32c:00000000"))
        finally:
            ckmod._crc32c, ckmod._warned_no_crc32c[:] = saved[0], saved[1]

    def test_a_software_crc32c_is_not_the_default(self):
        """crc32c only where the module is hardware-based: a software one
        holds the GIL while it sums (sha256 instead, said once); parts
        summed with crc32c are still checked with it."""
        import types
        import warnings
        import stallfree.checkpoint as ckmod
        real = ckmod._crc32c() or types.SimpleNamespace(crc32c=lambda data, value=0: 0)
        saved = ckmod._crc32c, list(ckmod._warned_no_crc32c)
        try:
            for hardware, want in ((True, "crc32c"), (False, "sha256")):
                module = types.SimpleNamespace(crc32c=real.crc32c, hardware_based=hardware)
                ckmod._crc32c, ckmod._warned_no_crc32c[:] = (lambda: module), []
                with warnings.catch_warnings(record=True) as w:
                    warnings.simplefilter("always")
                    self.assertEqual(ckmod._checksum_algo("crc32c"), want)
                    self.assertEqual(ckmod._checksum_algo("crc32c"), want)
                    self.assertEqual(ckmod._checksum_algo("sha256"), "sha256")
                said = [str(x.message) for x in w if "crc32c" in str(x.message)]
                self.assertEqual(len(said), 0 if hardware else 1, said)
                if not hardware:
                    self.assertIn("not hardware-based", said[0])
                summer = ckmod._Summer.for_header("crc32c:00000000")
                self.assertIsNotNone(summer)
                self.assertEqual(summer.algo, "crc32c")
        finally:
            ckmod._crc32c, ckmod._warned_no_crc32c[:] = saved[0], saved[1]

    def test_summer_matches_the_node(self):
        from stallfree.checkpoint import _Summer, _same_sum
        if _Summer.for_header("crc32c:") is not None:
            h = _Summer("crc32c")
            h.update(b"1234")
            h.update(b"56789")
            self.assertEqual(h.header(), "crc32c:e3069283")  # the CRC-32C check value of "123456789"
        h = _Summer("sha256")
        h.update(b"abc")
        self.assertTrue(_same_sum(h.header(), "sha256:" + h.header()))


if __name__ == "__main__":
    unittest.main()


class ChainFileTest(unittest.TestCase):
    """load()'s file over a rank's mapped parts in a row: every read and seek
    answers as one file of the parts joined would (empty parts, reads that
    cross parts, reads past the end)."""

    def test_reads_and_seeks_as_the_joined_bytes(self):
        import io
        import random
        from stallfree.checkpoint import _ChainFile

        rnd = random.Random(5)
        parts = [bytes(rnd.getrandbits(8) for _ in range(n)) for n in (7, 0, 1, 4096, 0, 300, 5)]
        whole = b"".join(parts)
        f, ref = _ChainFile([memoryview(p) for p in parts]), io.BytesIO(whole)
        for _ in range(400):
            if rnd.random() < 0.3:
                off, whence = rnd.choice([(rnd.randrange(-10, len(whole) + 10), io.SEEK_SET),
                                          (rnd.randrange(-20, 20), io.SEEK_CUR), (rnd.randrange(-30, 5), io.SEEK_END)])
                if whence == io.SEEK_SET and off < 0:
                    off = 0
                self.assertEqual(f.seek(off, whence), ref.seek(max(0, ref.seek(0, io.SEEK_CUR) + off) if whence == io.SEEK_CUR
                                                               else max(0, len(whole) + off) if whence == io.SEEK_END else off))
            n = rnd.randrange(0, 600)
            self.assertEqual(f.read(n), ref.read(n))
            self.assertEqual(f.tell(), ref.tell())
        f.seek(0)
        self.assertEqual(f.read(), whole)


class HostileNodeTest(unittest.TestCase):
    """A restore reads no more of a part than its listed size, whatever the
    node sends: the third attack round had a fake node answer a 1000-byte
    part with a 1.5 GB body, and the restoring process grew to 3.2 GB."""

    def test_a_part_longer_than_listed_is_refused_unread(self):
        import http.server
        import threading

        sent = []

        class Endless(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                if not self.path.endswith("/parts/0"):
                    body = b'{"error":"no such route"}'
                    self.send_response(404)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                    return
                self.send_response(200)
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                chunk = b"x" * (1 << 16)
                try:
                    for _ in range(4096):  # up to 256 MiB, unless the reader stops
                        self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                        sent.append(len(chunk))
                except OSError:
                    pass  # the reader hung up: that is the point

            def log_message(self, *a):
                pass

        srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Endless)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        try:
            ck = Checkpointer(f"http://127.0.0.1:{srv.server_address[1]}", "hostile")
            with self.assertRaises(StallfreeError) as e:
                ck._get(1, "0", 1000)
            self.assertIn("more than its 1000 bytes", str(e.exception))
            ck.close()
        finally:
            srv.shutdown()
            srv.server_close()
        self.assertLess(sum(sent), 64 << 20, "the node was read to the end")
