"""Seeing the stall: two ranks of a job report to two nodes of three, one
rank slowed on purpose; a third node's GET /v1/jobs/{job} shows both, the slow
one marked as the straggler, with the wait shares the ranks measured."""

import os
import sys
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))
from harness import Cluster, ClusterCase, wait_until  # noqa: E402

from stallfree import Client  # noqa: E402
from stallfree.meter import StallMeter  # noqa: E402


def batches(n, fetch_s):
    for i in range(n):
        time.sleep(fetch_s)  # the data the loop waits for
        yield [i] * 8


class StallViewTest(ClusterCase):
    def setUp(self):
        self.make_tmp("sf-stall-")
        self.write_files(4, 1, lambda i: f"f{i}", 10, 10)
        self.cluster = Cluster(self.tmp, n=3)

    def test_straggler_and_wait_shares_cluster_wide(self):
        urls = [u for _, u in self.cluster.nodes]
        c0 = Client(urls[0])
        wait_until(lambda: c0.json("PUT", "/v1/datasets/ds", {"source": self.data}), 30, "registration")
        c0.json("PUT", "/v1/jobs/train", {"dataset": "ds", "seed": 1, "world_size": 2, "batch_size": 8,
                                           "ranks": [self.cluster.nodes[0][0], self.cluster.nodes[1][0]]})
        meters = []
        for rank, step_s in enumerate((0.01, 0.04)):  # rank 1's step is 4x rank 0's
            m = StallMeter(urls[rank], batches(20, 0.01), job="train", rank=rank, report_every=5)
            for _ in m:
                time.sleep(step_s)
            meters.append(m)
        view = Client(urls[2])
        wait_until(lambda: len(view.json("GET", "/v1/jobs/train").get("stall", [])) == 2, 10, "both ranks in the view")
        stall = {r["rank"]: r for r in view.json("GET", "/v1/jobs/train")["stall"]}
        self.assertEqual(stall[0]["node"], self.cluster.nodes[0][0])
        self.assertEqual(stall[1]["node"], self.cluster.nodes[1][0])
        self.assertFalse(stall[0]["straggler"])
        self.assertTrue(stall[1]["straggler"])
        for r, m in enumerate(meters):
            measured = m.wait_seconds / (m.wait_seconds + m.step_seconds)
            self.assertAlmostEqual(stall[r]["wait_share"], measured, delta=0.05, msg=f"rank {r}")
            self.assertAlmostEqual(stall[r]["samples_per_s"], m.items / (m.wait_seconds + m.step_seconds),
                                   delta=0.05 * m.items / (m.wait_seconds + m.step_seconds))
            self.assertLess(stall[r]["last_report_s"], 30)
        # Each node's /metrics carries the ranks it heard, labelled.
        _, metrics = Client(urls[1]).request("GET", "/metrics")
        self.assertIn(b'stallfree_rank_straggler{job="train",rank="1"} 1', metrics)
        self.assertIn(b'stallfree_rank_wait_share{job="train",rank="1"}', metrics)


if __name__ == "__main__":
    unittest.main()
