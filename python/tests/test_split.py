"""The memory split by sensitivity on a real node: two jobs at once through
the Python stack (StallMeter reports, a threaded read-ahead loader), a
throttled source, an equal split, then the node's plan applied."""

import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from stallfree import Client  # noqa: E402
from stallfree.bench import split  # noqa: E402

from harness import Cluster, ClusterCase, wait_until  # noqa: E402

MiB = 1 << 20


class SplitTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="sf-split-test-")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def test_plan_gives_the_io_bound_job_more_memory(self):
        # 12 MiB datasets, 16 MiB of memory, storage at 4 MiB/s per dataset;
        # "gpu" computes 3 s an epoch, as long as reading its whole dataset
        # from storage takes, so a third of it cached hides its reads.
        res = split.run(memory=16 * MiB, item_size=32 << 10, fraction=0.75, source_rate=4 * MiB, compute_s=3.0,
                        batch_size=16, epochs_equal=2, epochs_plan=2, tmp=self.tmp, log=lambda s: None)
        before, applied, after = res["plan_before"], res["applied"], res["plan_after"]
        equal = res["equal_quota"]
        self.assertTrue(applied["applied"])
        # The plan's fields, for both jobs, measured from their reports.
        rows = {j["job"]: j for j in before["jobs"]}
        self.assertEqual(set(rows), {"io", "gpu"})
        for j in rows.values():
            for f in ("job", "dataset", "epoch_s", "epoch_s_predicted", "cached_bytes", "knee_bytes",
                      "seconds_saved_per_gib"):
                self.assertIn(f, j)
            self.assertGreater(j["epoch_s"], 0)
            self.assertLessEqual(j["cached_bytes"], equal)
        self.assertGreater(rows["gpu"]["step_s"], rows["io"]["step_s"])
        self.assertGreater(rows["io"]["seconds_saved_per_gib"], rows["gpu"]["seconds_saved_per_gib"])
        # The I/O-bound job's dataset gets more memory, the compute-bound
        # one's less, within the node's memory; the quotas are the split.
        s = applied["split"]
        self.assertGreater(s["ds-io"], equal)
        self.assertLess(s["ds-gpu"], equal)
        self.assertLessEqual(s["ds-io"] + s["ds-gpu"], 16 * MiB)
        quotas = {d["dataset"]: d["quota"] for d in after["datasets"]}
        self.assertEqual(quotas, s)
        # ... and its hit ratio (MinIO: cached / dataset) rises, its storage
        # reads per epoch fall; the other dataset holds no more than its quota.
        ratio = lambda p, ds: next(d["hit_ratio"] for d in p["datasets"] if d["dataset"] == ds)  # noqa: E731
        cached = lambda p, ds: next(d["cached_bytes"] for d in p["datasets"] if d["dataset"] == ds)  # noqa: E731
        self.assertGreater(ratio(after, "ds-io"), ratio(before, "ds-io"))
        self.assertGreater(cached(after, "ds-io"), equal)
        self.assertLessEqual(cached(after, "ds-io"), s["ds-io"])
        self.assertLessEqual(cached(after, "ds-gpu"), s["ds-gpu"])
        misses = lambda p, job: next(j["miss_bytes"] for j in p["jobs"] if j["job"] == job)  # noqa: E731
        self.assertLess(misses(after, "io"), misses(before, "io"))
        # Every epoch read every byte of its dataset, under both splits.
        for name in ("io", "gpu"):
            for e in res["jobs"][name]["epochs_equal"] + res["jobs"][name]["epochs_plan"]:
                self.assertEqual(e["bytes"], res["items"] * res["item_size"], f"{name} epoch {e['epoch']}")

    def test_auto_split_applies_the_plan_by_itself(self):
        # The same jobs, the node started with --auto-split planning after
        # every epoch: it moves memory to the I/O-bound job on its own.
        items, size = 384, 32 << 10
        for name, seed in (("io", 1), ("gpu", 2)):
            split.write_dataset(os.path.join(self.tmp, name), items, size, seed)
        node = split.Node(self.tmp, 16 * MiB, 4 * MiB, extra=("--auto-split", "--auto-split-epochs", "1"))
        try:
            equal = 16 * MiB * size // (size + split.ITEM_OVERHEAD) // 2
            for name in ("io", "gpu"):
                node.client.json("PUT", f"/v1/datasets/ds-{name}", {"source": os.path.join(self.tmp, name), "quota": equal})
            jobs = [{"name": "io", "dataset": "ds-io", "items": items, "batch_size": 16, "step_ms": 0.0, "seed": 11},
                    {"name": "gpu", "dataset": "ds-gpu", "items": items, "batch_size": 16, "step_ms": 3000 / 24, "seed": 12}]
            split.phase(node, jobs, 2, 0)
            quota = lambda ds: node.client.dataset(ds)["quota"]  # noqa: E731
            wait_until(lambda: quota("ds-io") > equal, 30, "the auto-split to raise the I/O-bound job's quota")
            self.assertLess(quota("ds-gpu"), equal)
            self.assertLessEqual(quota("ds-io") + quota("ds-gpu"), 16 * MiB)
        finally:
            node.stop()


class QuotaShareTest(ClusterCase):
    """A quota is cluster-wide: each of two real nodes holds at most its
    share of it by the ring, after setting (relayed by a follower),
    shrinking and growing."""

    def setUp(self):
        self.make_tmp("sf-quota-")
        self.write_files(240, 3, lambda i: f"q/{i:04d}.bin", 4000, 4000)
        self.cluster = Cluster(self.tmp)

    def test_each_node_holds_its_share(self):
        (n1, url1), (n2, url2) = self.cluster.nodes
        clients = {name: Client(url) for name, url in self.cluster.nodes}
        c1, c2 = clients[n1], clients[n2]
        wait_until(lambda: c1.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")
        sizes = [len(self.files[k]) for k in self.keys]
        total, biggest = sum(sizes), max(sizes)
        owners = c1.owners("ds")
        names = [m["name"] for m in owners["members"]]
        owned = {n: sum(s for s, o in zip(sizes, owners["owners"]) if names[o] == n) for n in names}
        self.assertEqual(sum(owned.values()), total)
        self.assertTrue(all(owned[n] for n in (n1, n2)), owned)

        def check(quota):
            for _ in range(2):  # the first pass offers every miss to its owner's store
                for start in range(0, len(self.keys), 60):
                    c1.batch("ds", list(range(start, min(start + 60, len(self.keys)))))
            held_all = 0
            for name, c in clients.items():
                held = c.stats()["bytes_cached"]
                limit = quota * owned[name] // total
                self.assertLessEqual(held, limit, f"{name} holds {held} bytes, its share of {quota} is {limit}")
                self.assertGreaterEqual(held, limit - biggest, f"{name} holds {held} bytes of its share {limit}")
                held_all += held
            self.assertLessEqual(held_all, quota)

        for quota, via in ((total // 2, c2), (total // 5, c1), (total * 4 // 5, c2)):
            d = via.set_quota("ds", quota)
            self.assertEqual(d["quota"], quota)
            wait_until(lambda: all(c.dataset("ds").get("quota") == quota for c in clients.values()),
                       30, "the quota on both nodes")
            check(quota)


if __name__ == "__main__":
    unittest.main()
