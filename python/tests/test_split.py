"""The memory split by sensitivity on a real node: two jobs at once through
the Python stack (StallMeter reports, a threaded read-ahead loader), a
throttled source, an equal split, then the node's plan applied."""

import os
import shutil
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from stallfree.bench import split  # noqa: E402

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


if __name__ == "__main__":
    unittest.main()
