"""Coordinated prep on a real two-node cluster: jobs are separate processes
(coordinated_job.py) running CoordinatedLoader; the group's batches are staged
at its owner node, which one of the two nodes relays to."""

import http.client
import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.parse

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import stallfree.coordinated as co  # noqa: E402
from stallfree import Client  # noqa: E402

from harness import BIN, Cluster, wait_until, without_cyclic_gc  # noqa: E402

JOB = os.path.join(os.path.dirname(__file__), "coordinated_job.py")
N, BATCH = 96, 4  # 24 batches an epoch


def raw(url, method, path, body=None):
    """(status, headers, body) of one request, whatever the status."""
    u = urllib.parse.urlsplit(url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    try:
        if isinstance(body, (dict, list)):
            body = json.dumps(body).encode()
        c.request(method, path, body=body)
        r = c.getresponse()
        return r.status, dict(r.getheaders()), r.read()
    finally:
        c.close()


def write(url, method, path, body=None):
    """raw() of a catalog write, retried while the cluster answers 503 (no raft
    leader for a moment: a loaded machine can make the fast test timers elect
    again)."""
    deadline = time.time() + 60
    while True:
        got = raw(url, method, path, body)
        if got[0] != 503 or time.time() > deadline:
            return got
        time.sleep(0.1)


class BatchBytesTest(unittest.TestCase):
    """A staged batch's bytes, however they are written: into a new buffer,
    a reused one, or a memfd straight from the arrays (no cluster)."""

    def batches(self):
        import numpy as np
        rng = np.random.default_rng(5)
        rows = [rng.integers(0, 255, (5, 7, 3), dtype=np.uint8) for _ in range(4)]
        rows[2] = rng.integers(0, 255, (7, 5, 3), dtype=np.uint8).transpose(1, 0, 2)  # not contiguous
        yield "a stack of rows", co._Stacked.of(rows)
        yield "an array", rng.random((3, 5))
        yield "a pair with labels", (co._Stacked.of(rows, tensor=True), np.arange(4, dtype=np.int64))
        yield "a dict, an empty array, a scalar", {"x": np.zeros((0, 3), np.float32), "n": 7,
                                                   "s": np.float64(2.5), "k": ["a", "b"]}
        yield "many arrays", [np.full((i % 3 + 1,), i, np.int16) for i in range(700)]
        yield "a stack of datetimes", co._Stacked.of([np.array([i, i + 1, i + 2], dtype="datetime64[s]") for i in range(2)])

    def test_every_way_writes_the_same_bytes(self):
        for what, batch in self.batches():
            with self.subTest(what):
                want = co.encode_batch(batch)
                dirty = bytearray(b"\xff" * (len(want) + 100))
                got = co.encode_batch(batch, alloc=lambda n: memoryview(dirty)[:n])
                self.assertEqual(bytes(got), want, "into a reused buffer: the padding zeroed")
                fd = co._memfd_of(co._pieces(batch))
                try:
                    self.assertEqual(os.pread(fd, len(want) + 1, 0), want, "into a memfd, from the arrays")
                    back = co.decode_batch(co._map_fd(fd))
                finally:
                    os.close(fd)
                self.assertEqual(co.encode_batch(back), want, "read back, the same batch")

    def test_a_mapped_batch_is_read_without_page_faults(self):
        """The mapping a job reads a staged batch through comes with its
        page table filled: reading every page of it faults none in (on a
        kernel with MADV_POPULATE_READ; a few faults are the interpreter's
        own), and a write copies a page for this job only."""
        import resource
        fd = os.memfd_create("stallfree-test")
        try:
            os.write(fd, bytes(range(256)) * (256 * 64))  # 1024 pages
            try:
                probe = co._map_fd(fd)
                probe.madvise(co._MADV_POPULATE_READ)
            except OSError:
                self.skipTest("this kernel has no MADV_POPULATE_READ (Linux < 5.14)")
            probe.close()
            m = co._map_fd(fd)
            before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
            total = sum(m[k] for k in range(0, len(m), 4096))
            faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before
            self.assertEqual(total, 0, "every page begins with byte 0")
            # Unpopulated, the kernel maps 16 pages a fault: 64 faults. A
            # few may be this interpreter's own allocations.
            self.assertLess(faults, 8, "every page was mapped already")
            m[0] = 7
            self.assertEqual(os.pread(fd, 1, 0), b"\x00", "copy-on-write: the file is unchanged")
            m.close()
        finally:
            os.close(fd)

    def test_short_writes_go_on_where_they_stopped(self):
        """writev may write less than asked: the rest follows, from the byte
        it stopped at, whatever the pieces' sizes."""
        import numpy as np
        batch = [np.arange(i * 37, dtype=np.uint8) for i in range(1, 60)]
        real = os.writev
        calls = []

        sizes = itertools.cycle([1, 50, 700, 4099])  # within a piece, and across several, stopping inside one

        def short(fd, views):
            data = b"".join(bytes(v) for v in views)
            n = real(fd, [data[:next(sizes)]])
            calls.append((len(data), n))
            return n

        os.writev = short
        try:
            fd = co._memfd_of(co._pieces(batch))
        finally:
            os.writev = real
        try:
            self.assertEqual(os.pread(fd, 1 << 20, 0), co.encode_batch(batch))
        finally:
            os.close(fd)
        self.assertTrue(all(n < asked for asked, n in calls[:-1]) and len(calls) > 20, "the writes were short")


class TransformRowsTest(unittest.TestCase):
    """A producer's transform outputs go into rows of one reused buffer as
    they come, each output let go before the next call (no cluster)."""

    def prep(self):
        return co._Prep("http://127.0.0.1:1", "", "ds", False, None, co.default_collate, 0)

    def test_each_output_is_let_go_before_the_next_call(self):
        import weakref

        import numpy as np
        prep, alive, made = self.prep(), [], []

        def f(x):
            alive.append(sum(r() is not None for r in made))  # earlier outputs still held when this call starts
            y = np.full((256, 256, 3), x, np.uint8)
            made.append(weakref.ref(y))
            return y

        rows = prep._rows(f, [1, 2, 3, 4])
        self.assertEqual(alive, [0, 0, 0, 0])
        self.assertEqual([int(r[0, 0, 0]) for r in rows], [1, 2, 3, 4])
        self.assertTrue(all(r.base is rows[0].base for r in rows), "rows of one buffer")
        batch = co._Stacked.of(rows)
        self.assertIsNotNone(batch, "the rows stack straight into the encoded batch")
        want = np.stack([np.full((256, 256, 3), k, np.uint8) for k in (1, 2, 3, 4)])
        self.assertEqual(co.encode_batch(batch), co.encode_batch(want))

    def test_the_buffer_is_reused_once_its_rows_are_gone(self):
        import numpy as np
        prep = self.prep()

        def f(x):
            return np.full((128, 256, 3), x, np.uint8)

        def where(rows):
            return rows[0].__array_interface__["data"][0]

        first = prep._rows(f, [1, 2])
        held = prep._rows(f, [3, 4])
        self.assertNotEqual(where(first), where(held), "a buffer in use is not handed out again")
        self.assertEqual([int(r[0, 0, 0]) for r in first], [1, 2], "and its rows keep their values")
        old = where(first)
        del first
        self.assertEqual(where(prep._rows(f, [5, 6])), old)

    def test_encoding_lets_the_rows_go(self):
        """Encoded (as bytes, into a buffer, or as pieces for a memfd), a
        batch's rows are let go as soon as the caller drops them, without
        the cyclic GC: a cycle kept every producer's pooled buffer busy
        until the GC ran, and the pool made a fresh one instead."""
        import numpy as np
        prep = self.prep()

        def f(x):
            return np.full((128, 256, 3), x, np.uint8)

        with without_cyclic_gc():
            for encode in (co.encode_batch, lambda b: co.encode_batch(b, bytearray), co._pieces):
                rows = prep._rows(f, [1, 2])
                buffer = prep._rows_pool._pool.buffers[-1].array
                held = sys.getrefcount(buffer)
                # A tuple too: the encoder recurses into it.
                pieces = encode((co._Stacked.of(rows), (np.arange(3), np.ones(2))))
                self.assertGreater(len(pieces), 0)
                del rows, pieces
                self.assertEqual(sys.getrefcount(buffer), held - 2, "only the pool refers to the buffer")
                del buffer

    def test_other_outputs_are_left_as_they_are(self):
        import numpy as np
        prep = self.prep()
        big = np.zeros((128, 256, 3), np.uint8)
        odd = np.ones((64, 256, 3), np.uint8)
        small = np.ones((4, 4), np.uint8)
        rows = prep._rows(lambda y: y, [big, odd, big.astype(np.int16), "text", big])
        self.assertIs(rows[1], odd, "another shape")
        self.assertEqual(rows[2].dtype, np.int16)
        self.assertEqual(rows[3], "text")
        self.assertIsNot(rows[4], big)
        self.assertIs(rows[4].base, rows[0].base, "a row, after outputs that are not")
        self.assertIsNone(co._Stacked.of(rows), "collated as before: default_collate sees the mix")
        self.assertTrue(all(r is small for r in prep._rows(lambda y: y, [small, small])), "too small to copy")
        self.assertEqual(prep._rows(lambda y: y + 1, [1, 2]), [2, 3])


class GroupCase(unittest.TestCase):
    """One cluster per class; a dataset of N items whose first six bytes are
    their index."""

    timeout = None  # --group-timeout; None: the default (30s)

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="stallfree-group")
        cls.data = os.path.join(cls.tmp, "data")
        os.makedirs(cls.data)
        for i in range(N):
            with open(os.path.join(cls.data, f"s{i:04d}"), "wb") as f:
                f.write(b"%06d" % i + os.urandom(64 + i))
        if cls.timeout:
            os.environ["STALLFREE_GROUP_TIMEOUT"] = cls.timeout
        try:
            cls.cluster = Cluster(cls.tmp)
        finally:
            os.environ.pop("STALLFREE_GROUP_TIMEOUT", None)
        cls.urls = [u for _, u in cls.cluster.nodes]
        c = Client(cls.urls[1])
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": cls.data}), 30, "registration")
        wait_until(lambda: all(Client(u).dataset("ds") for u in cls.urls), 30, "the dataset on both nodes")

    @classmethod
    def tearDownClass(cls):
        cls.cluster.stop()
        if not os.environ.get("STALLFREE_KEEP"):
            shutil.rmtree(cls.tmp, ignore_errors=True)

    def start_jobs(self, group, jobs, epochs=1, window=8, extra=None):
        """Starts job processes, alternating between the nodes; job 0 uses two
        worker processes, the others prepare in threads."""
        self.calls = os.path.join(self.tmp, group + ".calls")
        procs = []
        for j in range(jobs):
            args = [sys.executable, JOB, "--url", self.urls[j % 2], "--group", group, "--dataset", "ds",
                    "--out", os.path.join(self.tmp, f"{group}.{j}.out"), "--calls", self.calls, "--job", str(j),
                    "--jobs", str(jobs), "--batch", str(BATCH), "--window", str(window), "--epochs", str(epochs),
                    "--workers", "2" if j == 0 else "0"] + (extra or {}).get(j, [])
            procs.append(subprocess.Popen(args, stderr=open(os.path.join(self.tmp, f"{group}.{j}.err"), "w")))
        self.addCleanup(lambda: [p.kill() for p in procs if p.poll() is None])
        return procs

    def records(self, group, j):
        with open(os.path.join(self.tmp, f"{group}.{j}.out")) as f:
            return [json.loads(line) for line in f]

    def assert_each_once(self, recs, epochs, who):
        batches = [r for r in recs if "batch" in r]
        for e in range(epochs):
            idx = sorted(i for r in batches if r["epoch"] == e for i in r["indices"])
            self.assertEqual(idx, list(range(N)), f"{who}, epoch {e}: each index exactly once")
        self.assertEqual([(r["epoch"], r["batch"]) for r in batches],
                         [(e, b) for e in range(epochs) for b in range(N // BATCH)], f"{who}: batches in order")

    def finish(self, procs, timeout=120):
        for p in procs:
            self.assertEqual(p.wait(timeout=timeout), 0)

    def transform_calls(self):
        with open(self.calls) as f:
            return sum(1 for _ in f)

    def group(self, url, name):
        return Client(url).json("GET", f"/v1/groups/{name}")


class ThreeJobsTest(GroupCase):
    def test_three_jobs_share_every_batch(self):
        epochs = 2
        self.finish(self.start_jobs("hp", 3, epochs=epochs))
        recs = [self.records("hp", j) for j in range(3)]
        for j in range(3):
            self.assert_each_once(recs[j], epochs, f"job {j}")
            self.assertFalse(recs[j][-1]["alone"], f"job {j} was detached")
        digests = [[r["digest"] for r in rs if "batch" in r] for rs in recs]
        self.assertEqual(digests[0], digests[1], "jobs 0 and 1 saw the same batches")
        self.assertEqual(digests[0], digests[2], "jobs 0 and 2 saw the same batches")
        calls = self.transform_calls()
        self.assertLessEqual(calls, 1.1 * N * epochs, "the transform ran about once per sample, not J times")
        self.assertGreaterEqual(calls, N * epochs)
        a, b = self.group(self.urls[0], "hp"), self.group(self.urls[1], "hp")
        self.assertEqual(a, b, "every node shows the group alike")
        self.assertEqual(sum(j["prepared"] for j in a["jobs"]), epochs * N // BATCH)
        self.assertEqual(sum(j["served"] for j in a["jobs"]), 2 * epochs * N // BATCH)
        # Every job reaches its node through the Unix socket: each staged
        # batch was handed over as a memfd (relayed by a node not the owner).
        done = [next(r for r in rs if r.get("done")) for rs in recs]
        self.assertGreaterEqual(sum(d["handed_over"] for d in done), epochs * N // BATCH, done)

        ctl = [os.path.join(os.path.dirname(BIN), "cachectl"), "--node", self.urls[1]]
        ls = subprocess.run(ctl + ["groups", "ls"], capture_output=True, text=True, check=True).stdout
        self.assertRegex(ls, r"(?m)^hp\s+ds\s+7\s+4\s+8\s+3\s")
        shown = json.loads(subprocess.run(ctl + ["--json", "groups", "show", "hp"], capture_output=True, text=True, check=True).stdout)
        self.assertEqual(shown["jobs"], self.group(self.urls[1], "hp")["jobs"])
        subprocess.run(ctl + ["groups", "rm", "hp"], check=True)
        wait_until(lambda: all(raw(u, "GET", "/v1/groups/hp")[0] == 404 for u in self.urls), 30, "the group removed")


class SharedMemoryTest(GroupCase):
    def test_jobs_on_the_owners_host_map_the_batch(self):
        """A reader on the owner's host gets the path of the node's
        shared-memory copy, not the bytes; the loader maps it, and its arrays
        are views of that mapping, equal to what the producer staged."""
        import mmap
        import numpy as np
        from stallfree.client import _UnixHTTPConnection
        from stallfree.coordinated import decode_batch, encode_batch, _map_file
        c = Client(self.urls[0])
        # Three jobs: job 2 never reads, so the batch stays staged and its
        # file stays while the test opens it again (a dropped batch's file
        # goes a moment later).
        write(self.urls[0], "PUT", "/v1/groups/shm", {"dataset": "ds", "seed": 1, "batch_size": BATCH, "jobs": 3})
        owner = c.json("GET", "/v1/groups/shm")["owner"]
        url = next(u for name, u in self.cluster.nodes if name == owner)
        sock = Client(url)._socket_of(url)
        self.assertTrue(sock, "the owner's Unix socket")
        batch = {"x": np.arange(4 * 6, dtype=np.float32).reshape(4, 6), "i": np.arange(4)}
        body = encode_batch(batch)
        conn = _UnixHTTPConnection(sock, timeout=30)
        conn.request("PUT", "/v1/groups/shm/epochs/0/batches/0?job=0", body=body)
        r = conn.getresponse()
        r.read()
        self.assertEqual(r.status, 201)
        conn.request("GET", "/v1/groups/shm/epochs/0/batches/0?job=1&map=1")
        r = conn.getresponse()
        self.assertEqual((r.status, r.read()), (200, b""))
        path = r.getheader("X-Group-Map")
        self.assertTrue(path and path.startswith("/dev/shm/stallfree-"), path)
        self.assertEqual(int(r.getheader("X-Group-Map-Size")), len(body))
        m = _map_file(path)
        self.assertIsInstance(m, mmap.mmap)
        got = decode_batch(m)
        self.assertTrue(np.array_equal(got["x"], batch["x"]) and np.array_equal(got["i"], batch["i"]))
        self.assertFalse(got["x"].flags.owndata, "a view of the mapping, not a copy")
        got["x"][0, 0] = -1  # copy-on-write: the node's copy stays
        self.assertEqual(bytes(memoryview(_map_file(path))), body)
        conn.close()

    def test_a_file_gone_before_its_reader_opens_it(self):
        """A reader that opens a batch's file only after the node let it go
        (its linger is a moment) reads that batch's bytes instead, and maps
        the next batch again."""
        import mmap
        import numpy as np
        import stallfree.coordinated as co
        from stallfree.client import _UnixHTTPConnection
        write(self.urls[0], "PUT", "/v1/groups/gone", {"dataset": "ds", "seed": 1, "batch_size": BATCH, "jobs": 3})
        owner = Client(self.urls[0]).json("GET", "/v1/groups/gone")["owner"]
        url = next(u for name, u in self.cluster.nodes if name == owner)
        conn = _UnixHTTPConnection(Client(url)._socket_of(url), timeout=30)
        self.addCleanup(conn.close)
        bodies = [co.encode_batch({"x": np.full((4, 6), b, dtype=np.float32)}) for b in range(2)]
        for b, body in enumerate(bodies):
            conn.request("PUT", f"/v1/groups/gone/epochs/0/batches/{b}?job=0", body=body)
            r = conn.getresponse()
            self.assertEqual((r.status, r.read()[:0]), (201, b""))
        loader = co.CoordinatedLoader(url, "gone", 1, "ds", batch_size=BATCH, collate_fn=list)
        self.addCleanup(loader.close)
        opened = []
        real = co._map_file

        def gone_once(path, ino=None, dev=None):
            opened.append(path)
            if len(opened) == 1:
                raise FileNotFoundError(2, "No such file or directory", path)
            return real(path, ino, dev)

        co._map_file = gone_once
        try:
            first = loader._call("GET", 0, 0, None, 5)
            second = loader._call("GET", 0, 1, None, 5)
        finally:
            co._map_file = real
        self.assertEqual(len(opened), 2, "the reader was told a path for each batch")
        self.assertEqual(bytes(first), bodies[0], "batch 0: its bytes, read instead")
        self.assertIsInstance(second, mmap.mmap, "batch 1: mapped again")
        self.assertEqual(bytes(memoryview(second)), bodies[1])
        self.assertTrue(loader._map)

    def test_a_producer_hands_its_batch_over(self):
        """A producer on the owner's host hands its batch over in a memfd
        (?memfd=FD&ino=INODE, no body): the node seals it, so the producer
        can no longer write it, and a reader maps that very file, under the
        node's /proc/PID/fd."""
        import numpy as np
        from stallfree.client import _UnixHTTPConnection
        from stallfree.coordinated import decode_batch, encode_batch, _map_file, _memfd_of
        c = Client(self.urls[0])
        # Three jobs: the batch stays staged while the test opens its file.
        write(self.urls[0], "PUT", "/v1/groups/handed", {"dataset": "ds", "seed": 1, "batch_size": BATCH, "jobs": 3})
        owner = c.json("GET", "/v1/groups/handed")["owner"]
        url = next(u for name, u in self.cluster.nodes if name == owner)
        conn = _UnixHTTPConnection(Client(url)._socket_of(url), timeout=30)
        batch = {"x": np.arange(4 * 6, dtype=np.float32).reshape(4, 6), "i": np.arange(4)}
        body = encode_batch(batch)
        fd = _memfd_of([body])
        try:
            conn.request("PUT", f"/v1/groups/handed/epochs/0/batches/0?job=0&memfd={fd}&ino={os.fstat(fd).st_ino}")
            r = conn.getresponse()
            self.assertEqual((r.status, r.read()[:0]), (201, b""))
            with self.assertRaises(PermissionError, msg="the producer wrote after handing over"):
                os.pwrite(fd, b"X", 0)
        finally:
            os.close(fd)
        conn.request("GET", "/v1/groups/handed/epochs/0/batches/0?job=1&map=1")
        r = conn.getresponse()
        self.assertEqual((r.status, r.read()), (200, b""))
        path = r.getheader("X-Group-Map")
        self.assertRegex(path, r"^/proc/\d+/fd/\d+$")
        ino, dev = int(r.getheader("X-Group-Map-Ino")), int(r.getheader("X-Group-Map-Dev"))
        got = decode_batch(_map_file(path, ino, dev))
        self.assertTrue(np.array_equal(got["x"], batch["x"]) and np.array_equal(got["i"], batch["i"]))
        self.assertEqual(bytes(memoryview(_map_file(path))), body)
        # A path that names another file by the time it is opened (the
        # node's descriptor reused after the batch's linger) is not mapped.
        from stallfree.coordinated import _Reused
        with self.assertRaises(_Reused):
            _map_file(path, ino + 1, dev)
        with self.assertRaises(_Reused):
            _map_file(path, ino, dev + 1)
        conn.close()


class InProcessLoaderTest(GroupCase):
    """Loaders in this process, where their helpers can be watched."""

    def test_the_epoch_order_is_drawn_once_an_epoch(self):
        """Each batch slices the epoch's order of the whole dataset once or
        twice (to prepare, to augment): drawn once an epoch, not once a
        slice, which would cost O(dataset) a batch."""
        import stallfree.coordinated as co

        drawn = []

        def counted(seed, epoch, n):
            drawn.append(epoch)
            return real(seed, epoch, n)

        seen = []
        loader = co.CoordinatedLoader(self.urls[0], "order", 0, "ds", transform=lambda b: int(bytes(b[:6])),
                                      batch_size=BATCH, jobs=1, collate_fn=list,
                                      augment=lambda x, idx, epoch, seed: seen.append((epoch, list(idx))) or x)
        self.addCleanup(loader.close)
        real, co.epoch_order = co.epoch_order, counted
        try:
            got = []
            for e in (0, 1, 0):
                loader.set_epoch(e)
                got.append([i for x in loader for i in x])
        finally:
            co.epoch_order = real
        self.assertEqual(drawn, [0, 1], "one draw an epoch; epoch 0 again is still held")
        for e, g in zip((0, 1, 0), got):
            self.assertEqual(g, real(loader.seed, e, N), f"epoch {e}: every sample, in the group's order")
        # augment runs in the loader's threads, so batches in any order
        want = [(e, g[k:k + BATCH]) for e, g in zip((0, 1, 0), got) for k in range(0, N, BATCH)]
        self.assertEqual(sorted(seen), sorted(want), "augment got each batch's indices")

    def test_a_producers_rows_buffer_is_reused_batch_after_batch(self):
        """F's outputs go into a pooled rows buffer that is free again once
        its batch is staged, without the cyclic GC: a buffer held until the
        GC ran made the pool allocate (and the kernel fault in) a fresh one
        for most batches."""
        import numpy as np
        import stallfree.coordinated as co

        def f(b):  # 96 KiB, above the size the pool takes
            return np.full((128, 256, 3), int(bytes(b[:6])) % 251, np.uint8)

        loader = co.CoordinatedLoader(self.urls[0], "rows", 0, "ds", transform=f, batch_size=BATCH, jobs=1,
                                      window=2)
        self.addCleanup(loader.close)
        with without_cyclic_gc():
            seen = 0
            for b, x in enumerate(loader):
                want = np.array(loader.indices(0, b)) % 251
                self.assertTrue(np.array_equal(np.asarray(x)[:, 0, 0, 0], want), f"batch {b}'s samples")
                seen += 1
            buffers = len(loader._prep._rows_pool._pool.buffers)
        self.assertEqual(seen, N // BATCH)
        # One batch in flight (window 2), the next asked for only once it is
        # yielded, by when its rows are staged and let go: one buffer.
        self.assertEqual(buffers, 1, f"{buffers} rows buffers for {seen} batches")

    def test_a_reader_too_late_for_a_file_makes_the_batch(self):
        """A job that opens a batch's file only after the node let it go
        (the batch dropped by its read, the linger over) gets the same batch
        all the same: asked again, the node answers that the batch was
        dropped, and the job makes it itself, once; it maps the next
        batches again."""
        import threading
        import stallfree.coordinated as co

        real, opened = co._map_file, []

        def late_once(path, ino=None, dev=None):
            opened.append(path)
            if len(opened) == 1:
                raise FileNotFoundError(2, "No such file or directory", path)
            return real(path, ino, dev)

        loaders = [co.CoordinatedLoader(self.urls[0], "late", j, "ds", transform=lambda b: bytes(b[:6]),
                                        batch_size=BATCH, jobs=2, collate_fn=list) for j in range(2)]
        for loader in loaders:
            self.addCleanup(loader.close)
        got = [None, None]

        def run(j):
            got[j] = [x for x in loaders[j]]

        co._map_file = late_once
        try:
            threads = [threading.Thread(target=run, args=(j,)) for j in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
        finally:
            co._map_file = real
        self.assertEqual(len(got[0]), N // BATCH)
        self.assertEqual(got[0], got[1], "both jobs got the same batches")
        self.assertEqual(len(opened), N // BATCH, "each job mapped the other's batches")
        self.assertEqual(sum(loader.calls for loader in loaders), N + BATCH, "the late batch was made twice")
        self.assertTrue(all(loader._map for loader in loaders), "mapping stays on")

    def test_a_refused_hand_over_sends_the_bytes(self):
        """A node that will not take the job's file (here: a memfd that
        cannot be sealed, as a node of another user cannot open it) answers
        400; the loader then sends the bytes, from then on, and the batches
        are the same."""
        import stallfree.coordinated as co

        def unsealable(pieces):
            fd = os.memfd_create("stallfree-batch", os.MFD_CLOEXEC)  # no MFD_ALLOW_SEALING
            for p in pieces:
                os.write(fd, bytes(memoryview(p).cast("B")))
            return fd

        def load(name):
            loader = co.CoordinatedLoader(self.urls[0], name, 0, "ds", transform=lambda b: bytes(b[:6]),
                                          batch_size=BATCH, jobs=1, collate_fn=list)
            self.addCleanup(loader.close)
            return loader, [x for x in loader]

        handed, want = load("handed")
        self.assertEqual((handed.handed_over, handed._handoff), (N // BATCH, True))
        real, co._memfd_of = co._memfd_of, unsealable
        try:
            sent, got = load("sent")
        finally:
            co._memfd_of = real
        self.assertEqual(got, want, "the same batches either way")
        self.assertEqual((sent.handed_over, sent._handoff), (0, False))
        info = Client(self.urls[0]).json("GET", "/v1/groups/sent")
        self.assertEqual(sum(j["prepared"] for j in info["jobs"]), N // BATCH, "every batch staged, as bytes")


class BadInputTest(GroupCase):
    def assert_error(self, status, got, what):
        code, _, body = got
        self.assertEqual(code, status, f"{what}: {body!r}")
        self.assertIn("error", json.loads(body), what)

    def groups(self):
        return sorted((g["name"], g["version"]) for g in Client(self.urls[0]).json("GET", "/v1/groups"))

    def test_malformed_and_refused(self):
        u0, u1 = self.urls
        spec = {"dataset": "ds", "seed": 1, "batch_size": BATCH, "jobs": 2, "window": 1}
        got = write(u1, "PUT", "/v1/groups/g", spec)
        self.assertEqual(got[0], 201, got[2])
        self.assertEqual(write(u0, "PUT", "/v1/groups/g", spec)[0], 200, "the same body again")
        before = self.groups()
        for body, status, what in [
            (b'{"dataset": "ds",', 400, "truncated JSON"),
            ({**spec, "extra": 1}, 400, "unknown field"),
            ({**spec, "jobs": 0}, 400, "J < 1"),
            ({**spec, "window": 0}, 400, "W < 1"),
            ({**spec, "batch_size": 0}, 400, "batch_size < 1"),
            ({**spec, "dataset": "nope"}, 404, "unknown dataset"),
        ]:
            self.assert_error(status, write(u0, "PUT", "/v1/groups/other", body), what)
        # A group over a deleted dataset.
        self.assertEqual(write(u1, "PUT", "/v1/datasets/gone", {"source": self.data})[0], 201)
        self.assertEqual(write(u1, "DELETE", "/v1/datasets/gone")[0], 204)
        self.assert_error(404, write(u0, "PUT", "/v1/groups/other", {**spec, "dataset": "gone"}), "deleted dataset")
        self.assertEqual(self.groups(), before, "refused definitions changed nothing")

        p = "/v1/groups/g/epochs/0/batches/"
        self.assertEqual(raw(u0, "PUT", p + "0?job=0", b"first")[0], 201)
        self.assertEqual(raw(u1, "PUT", p + "0?job=0", b"first")[0], 200, "the same bytes again")
        self.assert_error(409, raw(u1, "PUT", p + "0?job=1", b"other"), "other bytes")
        self.assertEqual(raw(u0, "PUT", p + "1?job=1", b"one")[0], 201)
        # Bound W x J = 2 batches: batch 2 waits for room, then 503.
        self.assert_error(503, raw(u1, "PUT", p + "2?job=0&wait=0.3s", b"two"), "past the bound")
        for q, what in [("0", "no job"), ("0?job=2", "job out of range"), ("24?job=0", "batch out of range"),
                        ("x?job=0", "batch not a number"), ("0?job=0&wait=forever", "bad wait")]:
            self.assert_error(400, raw(u0, "GET", p + q), what)
        self.assert_error(409, write(u0, "PUT", "/v1/groups/g", {**spec, "seed": 2}), "redefined while attached")
        info = self.group(u0, "g")
        self.assertEqual(info, self.group(u1, "g"))
        self.assertEqual((info["staged_batches"], info["seed"]), (2, 1), "refused requests changed nothing")
        self.assertEqual([(j["epoch"], j["batch"], j["detached"], j["prepared"]) for j in info["jobs"]],
                         [(0, 0, False, 1), (0, 1, False, 1)])
        code, _, body = raw(u1, "GET", p + "0?job=1")
        self.assertEqual((code, body), (200, b"first"), "the first bytes stay")

        # A read waits, then 404 (another group: a read moves its job, and
        # W=1 would detach the other).
        self.assertEqual(write(u0, "PUT", "/v1/groups/w", {**spec, "window": 8})[0], 201)
        self.assert_error(404, raw(u0, "GET", "/v1/groups/w/epochs/0/batches/1?job=0&wait=0.2s"), "not staged")

        self.assertEqual(write(u1, "DELETE", "/v1/groups/g")[0], 204)
        wait_until(lambda: all(raw(u, "GET", "/v1/groups/g")[0] == 404 for u in self.urls), 30, "the group gone")
        self.assert_error(404, raw(u0, "GET", "/v1/groups/g"), "deleted group")
        wait_until(lambda: raw(u0, "GET", p + "1?job=0")[0] == 404, 30, "its batches gone")
        self.assert_error(404, raw(u1, "GET", p + "1?job=0"), "batch of a deleted group")


class DetachTest(GroupCase):
    timeout = "2s"

    def stopped(self, proc, group, j):
        if proc.poll() is not None:
            with open(os.path.join(self.tmp, f"{group}.{j}.err")) as f:
                raise AssertionError(f"job {j} exited ({proc.returncode}) before stopping: {f.read()}")
        with open(f"/proc/{proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "T"

    def await_stopped(self, proc, group, j):
        deadline = time.time() + 60
        while not self.stopped(proc, group, j):
            self.assertLess(time.time(), deadline, f"job {j} never stopped")
            time.sleep(0.05)

    def detached_everywhere(self, group, j):
        return all(self.group(u, group)["jobs"][j]["detached"] for u in self.urls)

    def two_loaders(self, url, group):
        """Two in-process loaders of a new group of two jobs, and the list
        that F appends to at each call."""
        calls = []

        def f(b):
            calls.append(1)
            return bytes(b[:6])

        loaders = [co.CoordinatedLoader(url, group, j, "ds", transform=f, batch_size=BATCH, jobs=2,
                                        collate_fn=list) for j in range(2)]
        for loader in loaders:
            self.addCleanup(loader.close)
        return loaders, calls

    def read_epoch(self, loaders, epoch):
        """Both loaders read the epoch at once (each in a thread); checks that
        they got the same batches, all of them."""
        import threading

        got = [None] * len(loaders)

        def run(j):
            loaders[j].set_epoch(epoch)
            got[j] = [x for x in loaders[j]]

        threads = [threading.Thread(target=run, args=(j,)) for j in range(len(loaders))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(len(got[0]), N // BATCH, f"epoch {epoch}")
        self.assertEqual(got[0], got[1], f"epoch {epoch}: both jobs got the same batches")

    def test_jobs_made_long_before_their_first_batch_stay_attached(self):
        """Two loaders made (the group defined and asked for), then a setup
        longer than --group-timeout (a model built, a checkpoint loaded)
        before either reads: the group's clock starts at its first batch
        request, so both stay attached and F runs once per item."""
        loaders, calls = self.two_loaders(self.urls[0], "setup")
        time.sleep(3.0)  # the setup: longer than the 2 s timeout (nothing to await: the time is the point)
        self.read_epoch(loaders, 0)
        self.assertEqual([loader.alone for loader in loaders], [False, False], "neither was detached")
        self.assertEqual(len(calls), N, "each item prepared once in the group")

    def test_a_pause_between_epochs_longer_than_the_timeout_detaches_no_job(self):
        """Every job pauses after an epoch (a validation pass) for longer
        than --group-timeout: their loaders say they are alive meanwhile, so
        none is detached and the next epoch is shared too. The loaders use
        the node that does not own the group: their reports are relayed."""
        write(self.urls[0], "PUT", "/v1/groups/pause", {"dataset": "ds", "seed": 0, "batch_size": BATCH, "jobs": 2})
        owner = Client(self.urls[0]).json("GET", "/v1/groups/pause")["owner"]
        other = next(u for name, u in self.cluster.nodes if name != owner)
        loaders, calls = self.two_loaders(other, "pause")
        self.read_epoch(loaders, 0)
        time.sleep(3.5)  # the pause, longer than the 2 s timeout (nothing to await: the time is the point)
        self.read_epoch(loaders, 1)
        self.assertEqual([loader.alone for loader in loaders], [False, False], "neither was detached")
        self.assertEqual(len(calls), 2 * N, "each item prepared once an epoch in the group")
        self.assertTrue(all(not j["detached"] for j in self.group(self.urls[0], "pause")["jobs"]))

    def test_stopped_job_is_detached_and_finishes_alone(self):
        # Job 2 stops itself after its third batch (SIGSTOP), for longer
        # than the window and the group timeout.
        procs = self.start_jobs("st", 3, window=2, extra={2: ["--stop-after", "3"]})
        self.await_stopped(procs[2], "st", 2)
        wait_until(lambda: self.detached_everywhere("st", 2), 60, "job 2 detached on every node")
        self.finish(procs[:2])
        procs[2].send_signal(signal.SIGCONT)
        self.finish(procs[2:])
        recs = [self.records("st", j) for j in range(3)]
        for j in range(3):
            self.assert_each_once(recs[j], 1, f"job {j}")
        self.assertTrue(recs[2][-1]["alone"], "job 2 went on alone")
        # Seeded augmentation: the batches job 2 made alone are the ones the
        # others read.
        digests = [[r["digest"] for r in rs if "batch" in r] for rs in recs]
        self.assertEqual(digests[0], digests[1])
        self.assertEqual(digests[0], digests[2])

    def test_killed_job_is_detached_and_the_others_finish(self):
        procs = self.start_jobs("kl", 3, window=8, extra={1: ["--stop-after", "2"]})
        self.await_stopped(procs[1], "kl", 1)
        procs[1].kill()
        procs[1].wait()
        wait_until(lambda: self.detached_everywhere("kl", 1), 60, "job 1 detached on every node")
        self.finish([procs[0], procs[2]])
        for j in (0, 2):
            self.assert_each_once(self.records("kl", j), 1, f"job {j}")
        info = self.group(self.urls[0], "kl")
        self.assertIn("no request", info["jobs"][1]["why"])


if __name__ == "__main__":
    unittest.main()
