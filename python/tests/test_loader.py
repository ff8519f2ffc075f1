"""A real torch DataLoader (2 worker processes) over a real two-node cluster."""

import os
import random
import shutil
import signal
import hashlib
import http.client
import io
import json
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import torch.utils.data  # noqa: E402

from stallfree import Client, StallfreeError, decode  # noqa: E402
from stallfree.torch import CachedDataset, LocalitySampler, StallMeter  # noqa: E402

from harness import BIN, ROOT, Cluster, ClusterCase, free_port, wait_until  # noqa: E402,F401
from images import JPEGS, PNGS, check_decoded_images  # noqa: E402


class LoaderTest(ClusterCase):
    def setUp(self):
        self.make_tmp("stallfree-py")
        self.write_files(203, 1, lambda i: f"c{i % 4}/s{i:04d}.bin", 500, 3000)
        self.cluster = Cluster(self.tmp)

    def test_two_ranks_two_epochs(self):
        (n1, url1), (n2, url2) = self.cluster.nodes
        c = Client(url2)
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")
        c.json("PUT", "/v1/jobs/train", {"dataset": "ds", "seed": 9, "world_size": 2, "batch_size": 8, "ranks": [n1, n2]})
        self.assertEqual(Client(url1).item("ds", self.keys[5]), self.files[self.keys[5]])
        self.assertEqual(Client(url1).batch("ds", [3, 1])[1], (self.keys[1], self.files[self.keys[1]]))
        with self.assertRaises(StallfreeError) as e:
            c.item("ds", "no/such/key")
        self.assertEqual(e.exception.status, 404)

        waited_batches = 0
        for epoch in range(2):
            orders = []
            for rank, (_, url) in enumerate(self.cluster.nodes):
                dataset = CachedDataset(url, "ds")
                sampler = LocalitySampler(url, "train", rank)
                sampler.set_epoch(epoch)
                loader = torch.utils.data.DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=2,
                                                     collate_fn=list)
                order = list(iter(sampler))
                self.assertEqual(len(order), len(sampler))
                self.assertEqual(len(order), len(self.files) // 2)
                samples = [s for batch in StallMeter(url, loader, job="train", rank=rank, report_every=5) for s in batch]
                waited_batches += (len(order) + 7) // 8
                self.assertEqual(len(samples), len(order))
                for i, s in zip(order, samples):
                    self.assertEqual(s, self.files[self.keys[i]], f"epoch {epoch} rank {rank} index {i}")
                orders.append(order)
            self.assertFalse(set(orders[0]) & set(orders[1]), "ranks share samples")
            self.assertEqual(len(orders[0]), len(orders[1]))

        reported = sum(Client(url).stats()["loader_batches"] for _, url in self.cluster.nodes)
        waited = sum(Client(url).stats()["loader_wait_seconds"] for _, url in self.cluster.nodes)
        self.assertEqual(reported, waited_batches)
        self.assertGreater(waited, 0)
        metrics = Client(url1).request("GET", "/metrics")[1].decode()
        self.assertIn("stallfree_loader_wait_seconds_total", metrics)

    def test_minibatches_in_one_request(self):
        (n1, url1), (n2, url2) = self.cluster.nodes
        c = Client(url1)
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")
        c.json("PUT", "/v1/jobs/batched", {"dataset": "ds", "seed": 3, "world_size": 2, "batch_size": 16, "ranks": [n1, n2]})
        sampler = LocalitySampler(url1, "batched", 0)
        order = list(iter(sampler))

        # In this process: count the requests one epoch takes.
        dataset = CachedDataset(url1, "ds")
        dataset.max_batch = 10  # minibatches of 16 split into 10 + 6
        calls = []
        request = dataset.client.request
        dataset.client.request = lambda *a, **kw: calls.append(a[:2]) or request(*a, **kw)
        batches = torch.utils.data.BatchSampler(sampler, batch_size=16, drop_last=False)
        loader = torch.utils.data.DataLoader(dataset, sampler=batches, batch_size=None, collate_fn=list)
        samples = [s for batch in loader for s in batch]
        self.assertEqual(samples, [self.files[self.keys[i]] for i in order])
        self.assertEqual(len(calls), sum((len(b) + 9) // 10 for b in batches))
        self.assertTrue(all(method == "POST" and path.endswith("/batch") for method, path in calls), calls[:3])

        # Worker processes, the way training runs it.
        loader = torch.utils.data.DataLoader(CachedDataset(url1, "ds", transform=len), sampler=batches,
                                             batch_size=None, num_workers=2, collate_fn=list)
        self.assertEqual([n for batch in loader for n in batch], [len(self.files[self.keys[i]]) for i in order])

    def test_items_copied_from_the_nodes_memory(self):
        """CachedDataset copies the items the node on its host holds out of
        that node's memory, mapped read-only; the rest (another node's, not
        yet read, or reused while copied) come through a batch request.
        Items of every size stay byte-exact, keys (for labels) included."""
        (n1, url1), _ = self.cluster.nodes
        c = Client(url1)
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")
        ds = CachedDataset(url1, "ds", with_key=True)
        everything = list(range(len(self.keys)))
        want = [(self.keys[i], self.files[self.keys[i]]) for i in everything]
        self.assertEqual(ds.__getitems__(everything), want)  # node 1's own items become resident
        mapper = ds._mapper
        self.assertIsNotNone(mapper, "no mapper for a node on this host")
        copied, fallbacks = mapper.copied, mapper.fallbacks
        self.assertEqual(copied + fallbacks, len(want))
        self.assertEqual(ds.__getitems__(everything), want)
        mine = mapper.copied - copied
        self.assertGreater(mine, 0, "nothing copied from node 1's memory")
        self.assertLess(mine, len(want), "node 2's items cannot be in node 1's memory")
        self.assertEqual(mapper.fallbacks - fallbacks, len(want) - mine)
        # Every third copied item's pages "freed" between the answer and
        # the copy's end: read again through the socket, still exact.
        m, moved = mapper._map, {}
        real = m.gen_sum

        def gen_sum(off, size, page):
            moved.setdefault(off, len(moved) % 3 == 0)
            return real(off, size, page) + (1 if moved[off] else 0)
        m.gen_sum = gen_sum
        copied = mapper.copied
        self.assertEqual(ds.__getitems__(everything), want)
        self.assertEqual(mapper.copied - copied, mine - sum(moved.values()))
        m.gen_sum = real
        # A node that answers the locate with an error (503 while it
        # catches up): this minibatch by batch request, which retries it;
        # the next one mapped again.
        locate = mapper._locate

        def busy(name, indices):
            raise StallfreeError(503, "catching up", retry_after=1)
        mapper._locate = busy
        self.assertEqual(ds.__getitems__(everything), want)
        self.assertIs(ds._mapper, mapper)
        mapper._locate = locate
        copied = mapper.copied
        self.assertEqual(ds.__getitems__(everything), want)
        self.assertEqual(mapper.copied - copied, mine)
        # A node gone mid-answer: plain batches (which fail over) from then on.
        ds2 = CachedDataset(url1, "ds", with_key=True)
        ds2.__getitems__(everything[:1])

        def cut(name, indices):
            raise http.client.IncompleteRead(b"")
        ds2._mapper._locate = cut
        self.assertEqual(ds2.__getitems__(everything), want)
        self.assertIsNone(ds2._mapper)
        # A node with nothing to map (204: --share-items=false, or TCP):
        # plain batches from then on.
        mapper._locate = lambda name, indices: None
        self.assertEqual(ds.__getitems__(everything[::-1]), want[::-1])
        self.assertIsNone(ds._mapper)
        self.assertEqual(ds.__getitems__(everything[:5]), want[:5])

    def test_failover_to_another_node(self):
        (_, url1), (_, url2) = self.cluster.nodes
        c = Client(url2)
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")
        client = Client(url2)
        self.assertEqual(client.index("ds", 0), self.files[self.keys[0]])  # learns the members
        self.cluster.procs[1].kill()
        self.cluster.procs[1].wait()
        self.assertEqual(client.index("ds", 7), self.files[self.keys[7]])


class OwnerRoutingTest(ClusterCase):
    """route="owner" over three real nodes: reads go to the owning node."""

    def setUp(self):
        self.make_tmp("stallfree-py-owner")
        self.write_files(300, 3, lambda i: f"d{i % 3}/o{i:04d}.bin", 100, 1500)
        self.cluster = Cluster(self.tmp, n=3)

    def stats(self):
        return [Client(url).stats() for _, url in self.cluster.nodes]

    def test_reads_go_to_the_owner(self):
        urls = [url for _, url in self.cluster.nodes]
        c = Client(urls[0])
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")
        for url in urls:
            Client(url).request("POST", "/v1/datasets/ds/warmup")
        wait_until(lambda: sum(s["items_cached"] for s in self.stats()) == len(self.keys), 60, "warm-up")
        table = c.owners("ds")
        by_name = {m["name"]: x for x, m in enumerate(table["members"])}
        share = [sum(1 for o in table["owners"] if o == by_name[name]) for name, _ in self.cluster.nodes]
        self.assertEqual(sum(share), len(self.keys))

        before = self.stats()
        client = Client(urls[0], route="owner")
        order = list(range(len(self.keys)))
        random.Random(4).shuffle(order)
        for i in order[:150]:
            self.assertEqual(client.index("ds", i), self.files[self.keys[i]], f"index {i}")
        for start in range(150, 300, 50):
            got = client.batch("ds", order[start:start + 50])
            self.assertEqual(got, [(self.keys[i], self.files[self.keys[i]]) for i in order[start:start + 50]])
        after = self.stats()
        for x, (b, a) in enumerate(zip(before, after)):
            self.assertEqual(a["hits_peer"], b["hits_peer"], f"node {x} fetched from a peer")
            self.assertEqual(a["hits_local"] - b["hits_local"], share[x], f"node {x} served other than its share")
            self.assertEqual(a["misses"], b["misses"])

        # In DataLoader workers, the way training runs it.
        loader = torch.utils.data.DataLoader(CachedDataset(urls[0], "ds", route="owner"), batch_size=16,
                                             sampler=order, num_workers=2, collate_fn=list)
        self.assertEqual([s for b in loader for s in b], [self.files[self.keys[i]] for i in order])

        # A node killed mid-epoch: its items come through the others, no error.
        self.cluster.procs[2].kill()
        self.cluster.procs[2].wait()
        for i in order:
            self.assertEqual(client.index("ds", i), self.files[self.keys[i]], f"index {i} after a kill")
        self.assertEqual(client.batch("ds", order[:64]), [(self.keys[i], self.files[self.keys[i]]) for i in order[:64]])


class TarLoaderTest(ClusterCase):
    """The same loader over WebDataset shards written by Python's tarfile."""

    def setUp(self):
        self.make_tmp("stallfree-py-tar")
        self.data = os.path.join(self.tmp, "shards")
        os.makedirs(self.data)
        rnd = random.Random(2)
        self.samples = []  # in sample-index order: shards in order, then archive order
        for shard in range(3):
            name = f"train-{shard:03d}.tar"
            with tarfile.open(os.path.join(self.data, name), "w") as tf:
                for j in range(37):
                    key = f"s{shard}_{j:03d}"
                    # Real images (python/tests/images, written by Pillow): the
                    # loader's decode path opens them when Pillow is installed.
                    parts = {"jpg": JPEGS[(shard + j) % len(JPEGS)][1], "png": PNGS[j % len(PNGS)][1],
                             "cls": str(j % 5).encode(), "json": json.dumps({"j": j}).encode()}
                    for ext, b in parts.items():
                        info = tarfile.TarInfo(f"{key}.{ext}")
                        info.size = len(b)
                        tf.addfile(info, io.BytesIO(b))
                    self.samples.append(dict(parts, __key__=f"{name}/{key}"))
        self.cluster = Cluster(self.tmp)

    def test_two_ranks_two_workers_over_shards(self):
        (n1, url1), (n2, url2) = self.cluster.nodes
        c = Client(url1)
        wait_until(lambda: c.json("PUT", "/v1/datasets/wds", {"source": "tar+dir://" + self.data}), 30, "registration")
        info = c.dataset("wds")
        self.assertEqual((info["samples"], info["items"], info["shards"]), (len(self.samples), 4 * len(self.samples), 3))
        self.assertEqual(c.sample("wds", 40), self.samples[40])
        self.assertEqual(c.samples("wds", [100, 2]), [self.samples[100], self.samples[2]])
        d = decode(c.sample("wds", 7))
        self.assertEqual((d["cls"], d["json"], d["__key__"]), (2, {"j": 7}, self.samples[7]["__key__"]))
        check_decoded_images(self, d, self.samples[7])

        c.json("PUT", "/v1/jobs/wtrain", {"dataset": "wds", "seed": 5, "world_size": 2, "batch_size": 8, "ranks": [n1, n2]})
        orders = []
        for rank, (_, url) in enumerate(self.cluster.nodes):
            dataset = CachedDataset(url, "wds")
            self.assertEqual(len(dataset), len(self.samples))
            sampler = LocalitySampler(url, "wtrain", rank)
            order = list(iter(sampler))
            self.assertEqual(len(order), len(self.samples) // 2)
            batches = torch.utils.data.BatchSampler(sampler, batch_size=8, drop_last=False)
            loader = torch.utils.data.DataLoader(dataset, sampler=batches, batch_size=None, num_workers=2,
                                                 collate_fn=list)
            got = [s for batch in loader for s in batch]
            self.assertEqual(len(got), len(order))
            for i, s in zip(order, got):
                self.assertEqual(s, self.samples[i], f"rank {rank} sample {i}")
            orders.append(order)
            # The job's own minibatch route gives the same samples.
            self.assertEqual(Client(url).job_batch("wtrain", 0, rank, 0), [self.samples[i] for i in order[:8]])
        self.assertFalse(set(orders[0]) & set(orders[1]), "ranks share samples")



class ResumeTest(ClusterCase):
    """A rank killed mid-epoch after a checkpoint and restarted from it reads
    exactly its share of the epoch: the samples consumed up to the checkpoint
    plus those after the restart, none repeated, none skipped."""

    def setUp(self):
        self.make_tmp("stallfree-py")
        self.write_files(331, 3, lambda i: f"c{i % 3}/r{i:04d}.bin", 300, 2000)
        self.cluster = Cluster(self.tmp)

    def run_rank(self, url, rank, ckpt, log, checkpoint_at, wait_after):
        script = os.path.join(os.path.dirname(__file__), "resume_rank.py")
        # A session of its own, so that killing the rank kills its DataLoader
        # workers too (a SIGKILLed parent leaves them blocked, holding every
        # pipe they inherited), and stderr to a file, not to this test's.
        err = open(os.path.join(self.tmp, f"rank{rank}.stderr"), "a")
        p = subprocess.Popen([sys.executable, script, url, "ds", "train", str(rank), "1", ckpt, log,
                              str(checkpoint_at), str(wait_after)], stdout=subprocess.PIPE, stderr=err, text=True,
                             start_new_session=True)
        err.close()
        self.addCleanup(self.kill_rank, p)
        return p

    @staticmethod
    def kill_rank(p):
        """Kill a rank and its workers (their process group), and reap it."""
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=15)
        p.stdout.close()

    def consumed(self, log):
        """The samples a log records up to its last checkpoint (the rest was
        lost with the process), and after it."""
        with open(log) as f:
            lines = f.read().splitlines()
        return [json.loads(line) for line in lines if line != "CHECKPOINT"], lines

    def test_killed_rank_resumes_from_its_checkpoint(self):
        (n1, url1), (n2, url2) = self.cluster.nodes
        c = Client(url1)
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")
        c.json("PUT", "/v1/jobs/train", {"dataset": "ds", "seed": 4, "world_size": 2, "batch_size": 8, "ranks": [n1, n2]})
        ckpt, log = os.path.join(self.tmp, "rank0.ckpt"), os.path.join(self.tmp, "rank0.log")

        # Rank 0 checkpoints after 6 batches, consumes 3 more, and is killed.
        p = self.run_rank(url1, 0, ckpt, log, checkpoint_at=6, wait_after=9)
        self.assertEqual(p.stdout.readline().strip(), "WAITING")
        self.kill_rank(p)
        with open(ckpt) as f:
            state = json.load(f)["sampler"]
        self.assertEqual(state["position"], 48)
        self.assertEqual(json.loads(json.dumps(state)), state)  # JSON all the way
        reported = Client(url1).json("GET", "/v1/jobs/train/positions")
        self.assertEqual([(p["rank"], p["epoch"], p["position"], p["generation"]) for p in reported],
                         [(0, 1, 48, state["generation"])])
        records, lines = self.consumed(log)
        self.assertEqual(len(records), 72)
        before = records[:lines.index("CHECKPOINT")]  # what the checkpointed model has seen
        self.assertEqual(len(before), 48)

        # Restarted from the checkpoint, it reads the rest of the epoch. The
        # log is cut back to the checkpoint, as the training state is.
        with open(log, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in before)
        p = self.run_rank(url1, 0, ckpt, log, checkpoint_at=0, wait_after=0)
        self.assertEqual(p.stdout.readline().strip(), "DONE")
        p.wait(timeout=15)
        resumed, _ = self.consumed(log)

        order = Client(url2).rank_order("train", 1, 0)
        self.assertEqual([i for i, _ in resumed], order, "rank 0's epoch is not its order exactly once")
        for i, digest in resumed:
            self.assertEqual(digest, hashlib.sha256(self.files[self.keys[i]]).hexdigest(), f"sample {i}")

        # Rank 1 ran undisturbed: its whole share, disjoint from rank 0's.
        log1 = os.path.join(self.tmp, "rank1.log")
        p = self.run_rank(url2, 1, os.path.join(self.tmp, "rank1.ckpt"), log1, checkpoint_at=0, wait_after=0)
        self.assertEqual(p.stdout.readline().strip(), "DONE")
        p.wait(timeout=15)
        other, _ = self.consumed(log1)
        self.assertEqual([i for i, _ in other], Client(url1).rank_order("train", 1, 1))
        self.assertFalse({i for i, _ in other} & set(order))
        self.assertEqual(len(order) + len(other), len(self.files) // 2 * 2)

    def test_resume_without_a_loader_and_after_a_resize(self):
        (n1, url1), (n2, _) = self.cluster.nodes
        c = Client(url1)
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")
        c.json("PUT", "/v1/jobs/train", {"dataset": "ds", "seed": 4, "world_size": 2, "batch_size": 8, "ranks": [n1, n2]})
        old = [Client(url1).rank_order("train", 2, r) for r in range(2)]
        sampler = LocalitySampler(url1, "train", 0)
        sampler.set_epoch(2)
        it = iter(sampler)
        first = [next(it) for _ in range(10)]
        state = sampler.state_dict()  # no loader: what was handed out was consumed
        self.assertEqual(state["position"], 10)
        fresh = LocalitySampler(url1, "train", 0)
        fresh.load_state_dict(state)
        fresh.set_epoch(2)
        self.assertEqual(len(fresh), len(sampler) - 10)
        self.assertEqual(first + list(fresh), old[0])
        fresh.set_epoch(3)  # the next epoch starts from its beginning
        self.assertEqual(list(fresh), Client(url1).rank_order("train", 3, 0))
        with self.assertRaises(ValueError):
            sampler.state_dict(consumed=len(sampler) + 1)

        # Resized to one rank: the state of old rank 0 (both ranks were at
        # position 10) resumes with everything both old ranks had left.
        c.json("PUT", "/v1/jobs/train", {"dataset": "ds", "seed": 4, "world_size": 1, "batch_size": 8, "ranks": [n1]})
        one = LocalitySampler(url1, "train", 0)
        one.load_state_dict(state)
        one.set_epoch(2)
        rest = set(old[0][10:]) | set(old[1][10:])
        self.assertEqual(len(one), len(rest))
        it = iter(one)
        part = [next(it) for _ in range(30)]
        mid = one.state_dict()
        self.assertEqual((mid["position"], mid["resumed_from"]), (30, [state["generation"], 10]))
        again = LocalitySampler(url1, "train", 0)
        again.load_state_dict(json.loads(json.dumps(mid)))
        again.set_epoch(2)
        # The rest of the resumed epoch through a DataLoader with workers:
        # every sample's bytes, each remaining sample once.
        loader = torch.utils.data.DataLoader(CachedDataset(url1, "ds"), batch_size=8, sampler=again, num_workers=2,
                                             collate_fn=list)
        order = list(iter(again))
        samples = [b for batch in loader for b in batch]
        self.assertEqual(len(samples), len(order))
        for i, data in zip(order, samples):
            self.assertEqual(data, self.files[self.keys[i]], f"resumed sample {i}")
        resumed = part + order
        self.assertEqual(len(resumed), len(rest))
        self.assertEqual(set(resumed), rest)
        again.set_epoch(3)
        self.assertEqual(list(again), Client(url1).rank_order("train", 3, 0))

        # Another seed is another job: nothing to resume.
        c.json("PUT", "/v1/jobs/train", {"dataset": "ds", "seed": 99, "world_size": 1, "batch_size": 8, "ranks": [n1]})
        with self.assertRaises(ValueError):
            LocalitySampler(url1, "train", 0).load_state_dict(state)


class ResplitLocalityTest(ClusterCase):
    """The issue's resize end to end through the Python sampler: a job of
    world 2 (ranks on py1, py2) over 1,200 items on three nodes, batch 16,
    checkpointed after 10 batches and resumed at world 3: the remaining
    samples are re-split each exactly once, and at most 10% of them are
    owned by a node other than their rank's (the Go test in locality checks
    seeds 1..20 against the traffic model)."""

    def setUp(self):
        self.make_tmp("stallfree-py")
        self.write_files(1200, 5, lambda i: f"d{i % 8}/x{i:05d}.bin", 16, 48)
        self.cluster = Cluster(self.tmp, n=3)

    def test_resumed_remainder_stays_local(self):
        (n1, url1), (n2, url2), (n3, url3) = self.cluster.nodes
        c = Client(url1)
        wait_until(lambda: c.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")
        c.json("PUT", "/v1/jobs/train", {"dataset": "ds", "seed": 7, "world_size": 2, "batch_size": 16,
                                         "ranks": [n1, n2]})
        states, rest = [], set()
        for rank, url in enumerate([url1, url2]):
            sampler = LocalitySampler(url, "train", rank)
            sampler.set_epoch(0)
            order = list(iter(sampler))
            states.append(sampler.state_dict(consumed=160))
            rest |= set(order[160:])
        self.assertEqual(states[0]["position"], states[1]["position"])

        resized = c.json("PUT", "/v1/jobs/train", {"dataset": "ds", "seed": 7, "world_size": 3, "batch_size": 16,
                                                   "ranks": [n1, n2, n3]})
        # A write through one node reaches the others' catalogs a moment
        # later (read-your-writes holds per node): await it on every node,
        # or a sampler may load the job as it was before the resize.
        for _, url in self.cluster.nodes:
            wait_until(lambda: Client(url).json("GET", "/v1/jobs/train")["version"] == resized["version"], 10,
                       "the resized job on " + url)
        owners = Client(url1).owners("ds")
        names = [m["name"] for m in owners["members"]]
        got, remote = [], 0
        for rank, (node, url) in enumerate(self.cluster.nodes):
            sampler = LocalitySampler(url, "train", rank)
            sampler.load_state_dict(states[0])
            sampler.set_epoch(0)
            order = list(iter(sampler))
            self.assertEqual(len(order), len(rest) // 3)
            remote += sum(names[owners["owners"][i]] != node for i in order)
            got += order
        self.assertEqual(len(got), len(set(got)), "a resumed sample given twice")
        self.assertTrue(set(got) <= rest and len(rest - set(got)) == len(rest) % 3)
        self.assertLessEqual(remote / len(got), 0.10, f"{remote} of {len(got)} resumed samples are remote")


if __name__ == "__main__":
    unittest.main()
