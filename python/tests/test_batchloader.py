"""The loader fast path (docs/api.md) against real cachenode processes: the
client's Unix socket, BatchLoader's order, counts and bytes, a node killed
mid-epoch, and the example's CNN loop over dir, S3 (MinIO) and tar datasets."""

import multiprocessing
import os
import shutil
import signal
import sys
import tempfile
import threading
import unittest

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))

from stallfree import Client, NodeUnreachable, StallfreeError  # noqa: E402
from stallfree.torch import BatchLoader, CachedDataset, LocalitySampler, StallMeter  # noqa: E402

from harness import Cluster, ClusterCase, TokenNodeCase, free_port, wait_until  # noqa: E402


def count_batch_requests(client):
    """Counts the batch requests client sends, by the node they go to."""
    counts, lock = {}, threading.Lock()
    send = client._request_once

    def counting(base, method, path, *args, **kwargs):
        if path.endswith("/batch"):
            with lock:
                counts[base] = counts.get(base, 0) + 1
        return send(base, method, path, *args, **kwargs)
    client._request_once = counting
    return counts


def tagged_length(b):
    """(the pid that ran the transform, the item's length)."""
    return torch.tensor([os.getpid(), len(b)])


def worker_collate(samples):
    """default_collate's batch, whether it was made in shared memory, and
    what get_worker_info() said where it was collated."""
    info = torch.utils.data.get_worker_info()
    x = torch.utils.data.default_collate(samples)
    return x, torch.tensor([x.is_shared(), info.id if info else -1, info.num_workers if info else 0])


class ListSampler:
    """A sampler with a fixed order per epoch, recording set_epoch calls."""

    def __init__(self, orders):
        self.orders, self.epoch, self.epochs = orders, 0, []

    def set_epoch(self, e):
        self.epoch = e
        self.epochs.append(e)

    def __iter__(self):
        return iter(self.orders[self.epoch])

    def __len__(self):
        return len(self.orders[self.epoch])


class BatchLoaderTest(ClusterCase):
    def setUp(self):
        self.make_tmp("stallfree-bl")
        self.write_files(203, 5, lambda i: f"c{i % 3}/s{i:04d}.bin", 700, 2500)
        self.cluster = Cluster(self.tmp, n=2)
        self.url = self.cluster.nodes[0][1]
        c = Client(self.url)
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")

    def test_client_switches_to_the_nodes_socket(self):
        name, url = self.cluster.nodes[0]
        sock = os.path.join(self.tmp, name, "stallfree.sock")
        c = Client(url)
        self.assertEqual(c.index("ds", 7), self.files[self.keys[7]])
        self.assertEqual(c._sockets, {url: sock}, "a loopback node's socket is used")
        self.assertEqual(Client("unix://" + sock).batch("ds", [2, 9]),
                         [(self.keys[2], self.files[self.keys[2]]), (self.keys[9], self.files[self.keys[9]])])
        tcp = Client(url, use_socket=False)
        self.assertEqual(tcp.index("ds", 7), self.files[self.keys[7]])
        self.assertEqual(tcp._sockets, {})
        # A socket this process cannot open: TCP, silently.
        os.rename(sock, sock + ".moved")
        try:
            fallback = Client(url)
            self.assertEqual(fallback.index("ds", 11), self.files[self.keys[11]])
            self.assertEqual(fallback._sockets, {})
        finally:
            os.rename(sock + ".moved", sock)
        # Another node's socket at the path the first one names is not used.
        other = os.path.join(self.tmp, self.cluster.nodes[1][0], "stallfree.sock")
        os.rename(sock, sock + ".moved")
        os.symlink(other, sock)
        try:
            wrong = Client(url)
            self.assertEqual(wrong.index("ds", 12), self.files[self.keys[12]])
            self.assertEqual(wrong._sockets, {}, "a socket answering as another member is not used")
        finally:
            os.remove(sock)
            os.rename(sock + ".moved", sock)

    def test_batches_in_the_samplers_order_each_index_once(self):
        ds = CachedDataset(self.url, "ds")
        orders = {e: list(range(len(self.keys)))[::-1][e:] + list(range(len(self.keys)))[::-1][:e] for e in range(2)}
        sampler = ListSampler(orders)
        loader = BatchLoader(ds, 16, sampler=sampler, threads=3, collate_fn=list, prefetch=2)
        requests = count_batch_requests(ds.client)
        self.assertEqual(len(loader), 13)  # 203 / 16, the last batch short
        for epoch in range(2):
            loader.set_epoch(epoch)
            batches = list(loader)
            self.assertEqual([len(b) for b in batches], [16] * 12 + [11])
            got = [s for b in batches for s in b]
            self.assertEqual(got, [self.files[self.keys[i]] for i in orders[epoch]], f"epoch {epoch}")
        self.assertEqual(sampler.epochs, [0, 1])
        self.assertEqual(sum(requests.values()), 26, "one batch request per minibatch")

        dropped = BatchLoader(ds, 16, shuffle=True, drop_last=True, threads=2, collate_fn=list, seed=3)
        self.assertEqual(len(dropped), 12)
        seen = []
        for epoch in range(2):
            dropped.set_epoch(epoch)
            flat = [s for b in dropped for s in b]
            self.assertEqual(len(flat), 192)
            self.assertEqual(len(set(flat)), 192, "no sample twice in an epoch")
            self.assertTrue(set(flat) <= set(self.files.values()))
            seen.append(flat)
        self.assertNotEqual(seen[0], seen[1], "a fresh permutation each epoch")

    def test_transform_in_threads_and_stall_meter(self):
        ds = CachedDataset(self.url, "ds")
        threads = set()

        def size(b):
            threads.add(threading.current_thread().name)
            return len(b)
        loader = BatchLoader(ds, 32, threads=2, transform=size)
        meter = StallMeter(self.url, loader, job="bl", report_every=3)
        sizes = [int(x) for batch in meter for x in batch]  # default_collate: a tensor per batch
        self.assertEqual(sizes, [len(self.files[k]) for k in self.keys])
        self.assertEqual(meter.batches, len(loader))
        self.assertTrue(threads and all(t.startswith("stallfree-batch") for t in threads), threads)
        self.assertEqual(Client(self.url).stats()["loader_batches"], len(loader))

    def test_transform_in_worker_processes(self):
        ds = CachedDataset(self.url, "ds")
        order = list(range(len(self.keys)))[::-1]
        loader = BatchLoader(ds, 16, sampler=order, threads=2, workers=2, transform=tagged_length, labels="folder")
        batches = list(loader)
        self.assertEqual(len(batches), 13)
        pids = torch.cat([x[:, 0] for x, _ in batches]).tolist()
        lengths = torch.cat([x[:, 1] for x, _ in batches]).tolist()
        self.assertEqual(lengths, [len(self.files[self.keys[i]]) for i in order])
        self.assertEqual(torch.cat([y for _, y in batches]).tolist(), [int(self.keys[i][1]) for i in order])
        self.assertNotIn(os.getpid(), pids, "the transform ran in worker processes")
        self.assertLessEqual(len(set(pids)), 2)
        self.assertEqual(multiprocessing.active_children(), [], "the workers are gone after the epoch")
        with self.assertRaises(ValueError):
            BatchLoader(ds, 16, workers=-1)

    def test_every_worker_process_has_a_batch_at_once(self):
        """By default a batch is in flight for every worker: the four
        batches' collates meet at a barrier in four worker processes, which
        times out (and the loop fails) when fewer are handed out at once."""
        ds = CachedDataset(self.url, "ds")
        barrier = multiprocessing.get_context("fork").Barrier(4, timeout=30)

        def meet(batch):
            barrier.wait()
            return torch.tensor([os.getpid()] * len(batch))
        loader = BatchLoader(ds, len(self.keys) // 4, threads=1, workers=4, drop_last=True, collate_fn=meet)
        self.assertEqual(loader.prefetch, 8)
        pids = {int(x[0]) for x in loader}
        self.assertEqual(len(pids), 4, "one batch in each worker at once")
        self.assertEqual(BatchLoader(ds, 16, threads=3).prefetch, 5, "threads alone: threads + 2")

    def test_a_worker_process_runs_torch_on_one_thread(self):
        """As a DataLoader's workers: 12 workers on 16 cores, each with the
        parent's 16 intra-op threads, ran at half a DataLoader's pace. The
        training process keeps its own."""
        before = torch.get_num_threads()
        torch.set_num_threads(4)
        self.addCleanup(torch.set_num_threads, before)
        ds = CachedDataset(self.url, "ds")
        loader = BatchLoader(ds, 16, threads=2, workers=2, transform=lambda b: torch.get_num_threads())
        seen = {int(n) for x in loader for n in x}
        self.assertEqual(seen, {1})
        self.assertEqual(torch.get_num_threads(), 4)

    def test_worker_processes_look_like_dataloader_workers(self):
        """In a worker, get_worker_info() answers as in a DataLoader's, and
        default_collate stacks the batch into shared memory there (no copy
        on its way to the training process)."""
        ds = CachedDataset(self.url, "ds")
        loader = BatchLoader(ds, 16, threads=2, workers=2, transform=tagged_length, collate_fn=worker_collate)
        seen = {}
        for x, probe in loader:
            shared, wid, n = probe.tolist()
            self.assertTrue(shared, "collated outside shared memory")
            self.assertEqual(n, 2)
            seen.setdefault(int(x[0, 0]), set()).add(wid)
        self.assertTrue(seen and all(len(ids) == 1 for ids in seen.values()), f"one id per worker: {seen}")
        self.assertTrue(set().union(*seen.values()) <= {0, 1}, seen)
        threads = BatchLoader(ds, 16, threads=2, transform=tagged_length, collate_fn=worker_collate)
        self.assertEqual([p.tolist()[1:] for _, p in threads][:1], [[-1, 0]], "threads are no DataLoader workers")

    def test_locality_sampler_and_its_state(self):
        (n1, url1), (n2, _) = self.cluster.nodes
        Client(url1).json("PUT", "/v1/jobs/j", {"dataset": "ds", "seed": 4, "world_size": 2, "batch_size": 8,
                                               "ranks": [n1, n2]})
        sampler = LocalitySampler(url1, "j", 0)
        sampler.set_epoch(1)
        order = list(iter(sampler))
        loader = BatchLoader(CachedDataset(url1, "ds"), 8, sampler=sampler, threads=3, collate_fn=list)
        loader.set_epoch(1)
        it = iter(loader)
        first = [next(it) for _ in range(4)]
        state = loader.state_dict()  # what the loop received, not what was fetched ahead
        self.assertEqual(state["position"], 32)
        it.close()
        self.assertEqual([s for b in first for s in b], [self.files[self.keys[i]] for i in order[:32]])

        resumed = LocalitySampler(url1, "j", 0)
        rest_loader = BatchLoader(CachedDataset(url1, "ds"), 8, sampler=resumed, threads=2, collate_fn=list)
        rest_loader.load_state_dict(state)
        rest = [s for b in rest_loader for s in b]
        self.assertEqual(rest, [self.files[self.keys[i]] for i in order[32:]])

    def test_bad_url_and_token_fail_at_construction(self):
        port = free_port()
        with self.assertRaises(NodeUnreachable) as e:
            CachedDataset(f"http://127.0.0.1:{port}", "ds")
        self.assertIn(f"127.0.0.1:{port}", str(e.exception))
        with self.assertRaises(ValueError):
            BatchLoader(CachedDataset(self.url, "ds"), 0)
        ds = CachedDataset(self.url, "ds")
        ds.client.json("DELETE", "/v1/datasets/ds")
        with self.assertRaises(StallfreeError) as e:
            BatchLoader(ds, 8)
        self.assertEqual(e.exception.status, 404)
        self.assertIn("BatchLoader: dataset 'ds'", str(e.exception))


class TokenTest(TokenNodeCase):
    """One node with a token: the socket is used with it, and a wrong token
    stops BatchLoader at construction."""

    token = "bl-token"

    def test_token(self):
        c = Client(self.url, token="bl-token")
        wait_until(lambda: c.json("PUT", "/v1/datasets/t", {"source": os.path.join(self.tmp, "data")}), 30, "node")
        self.assertEqual(c.index("t", 0), b"abc" * 100)
        self.assertEqual(c._sockets, {self.url: os.path.join(self.tmp, "n", "stallfree.sock")})
        self.assertEqual(os.stat(c._sockets[self.url]).st_mode & 0o777, 0o600)
        with self.assertRaises(StallfreeError) as e:
            Client("unix://" + c._sockets[self.url]).index("t", 0)
        self.assertEqual(e.exception.status, 401, "the token is checked on the socket too")
        ds = CachedDataset(self.url, "t", token="bl-token")
        ds.token, ds._client = "wrong", None
        with self.assertRaises(StallfreeError) as e:
            BatchLoader(ds, 4)
        self.assertEqual(e.exception.status, 401)
        self.assertIn("refused the token", str(e.exception))
        self.assertIn(self.url, str(e.exception))


    def test_error_names_the_node(self):
        c = Client(self.url, token="bl-token")
        wait_until(lambda: c.json("PUT", "/v1/datasets/t", {"source": os.path.join(self.tmp, "data")}), 30, "node")
        loader = BatchLoader(CachedDataset(self.url, "t", token="bl-token"), 1, sampler=[0] * 50, threads=1,
                             prefetch=1, collate_fn=list, retries=1)
        it = iter(loader)
        self.assertEqual(next(it), [b"abc" * 100])
        self.proc.kill()
        self.proc.wait()
        with self.assertRaises(NodeUnreachable) as e:
            list(it)
        self.assertIn(self.url, str(e.exception))


class NodeKilledTest(ClusterCase):
    """A node killed mid-epoch under BatchLoader on 3 nodes, owner-routed."""

    def setUp(self):
        self.make_tmp("stallfree-blkill")
        self.write_files(480, 9, lambda i: f"s{i:04d}.bin", 1000, 3000)
        self.cluster = Cluster(self.tmp, n=3)
        self.url = self.cluster.nodes[0][1]
        c = Client(self.url)
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")
        for _, u in self.cluster.nodes:
            Client(u).json("POST", "/v1/datasets/ds/warmup")
        wait_until(lambda: all(not Client(u).json("GET", "/v1/datasets/ds/warmup")["running"]
                               for _, u in self.cluster.nodes), 60, "warm-up")

    def test_owner_killed_mid_epoch(self):
        self.run_epoch_killing(2)

    def test_entry_node_killed_mid_epoch(self):
        self.run_epoch_killing(0)  # the node the loader's URL names: the client fails over

    def run_epoch_killing(self, victim_index):
        ds = CachedDataset(self.url, "ds", route="owner")
        owners = ds.client.owners("ds")
        self.assertEqual(len({o for o in owners["owners"]}), 3, "every node owns some items")
        requests = count_batch_requests(ds.client)
        order = list(range(len(self.keys)))
        order = order[1::2] + order[0::2]
        self.assertEqual(ds.__getitems__(order[:24]), [self.files[self.keys[i]] for i in order[:24]])
        # The entry node's items copied from its memory (all three nodes
        # are on this host; the loader maps the one its URL names), one
        # batch request to each other owner for the rest.
        self.assertGreater(ds._mapper.copied, 0)
        self.assertEqual(len(requests), 2, "one batch request per other owner node")
        self.assertTrue(all(n == 1 for n in requests.values()), requests)
        self.assertNotIn(self.url, requests)
        self.assertEqual(ds._mapper.copied + ds._mapper.fallbacks, 24)
        self.assertEqual(ds.client._sockets, {u: os.path.join(self.tmp, n, "stallfree.sock")
                                              for n, u in self.cluster.nodes}, "each node through its own socket")
        loader = BatchLoader(ds, 24, sampler=order, threads=3, collate_fn=list, prefetch=3)
        got = []
        for b, batch in enumerate(loader):
            if b == 5:
                victim = self.cluster.procs[victim_index]
                victim.send_signal(signal.SIGKILL)
                victim.wait()
            got.append(batch)
        self.assertEqual([len(b) for b in got], [24] * 20)
        self.assertEqual([s for b in got for s in b], [self.files[self.keys[i]] for i in order],
                         "every index exactly once, in order, bytes as on disk")


class ExampleTest(unittest.TestCase):
    """examples/train_stall.py, small: a CNN trained 3 epochs through
    BatchLoader over dir, S3 (MinIO) and tar datasets, and the direct loop."""

    def test_three_sources_three_epochs(self):
        import train_stall as ex
        tmp = tempfile.mkdtemp(prefix="stallfree-ex")
        try:
            samples, dir_root, minio, node = ex.setup(tmp, 300)
            try:
                for name, loader in ex.loaders(node.url, dir_root, 32, threads=2).items():
                    res = ex.train(loader, node.url, job=f"t-{name}", epochs=3)
                    want = [sum(1 for lbl, _ in samples if lbl == c) for c in range(ex.CLASSES)]
                    for r in res:
                        self.assertEqual(r["samples"], 300, f"{name} epoch {r['epoch']}")
                        self.assertEqual(r["per_class"], want, f"{name} epoch {r['epoch']}: labels")
                    if name == "direct":
                        continue
                    # The bytes each source serves, each index once.
                    ds = CachedDataset(node.url, name)
                    raw = [s for b in BatchLoader(ds, 64, threads=2, collate_fn=list) for s in b]
                    self.assertEqual(len(raw), 300)
                    if ds.tar:
                        self.assertEqual([(int(s["cls"]), s["img"]) for s in raw], samples)
                        self.assertEqual([s["__key__"] for s in raw],
                                         [f"train-{i // 256:06d}.tar/s{i:06d}" for i in range(300)])
                    else:
                        want_bytes = sorted(bytes([lbl]) + px for lbl, px in samples)
                        self.assertEqual(sorted(raw), want_bytes)
                self.assertEqual(Client(node.url).stats()["loader_batches"], 4 * 3 * 10)
            finally:
                node.stop()
                minio.stop()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
