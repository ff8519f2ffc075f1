"""A coordinated job's worker processes run torch on one thread each, as
DataLoader's workers do (BatchLoader's: test_batchloader)."""

import multiprocessing
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional
    torch = None

from stallfree import coordinated  # noqa: E402


def _threads(_):
    return torch.get_num_threads()


@unittest.skipIf(torch is None, "needs torch")
class WorkerThreadsTest(unittest.TestCase):
    def test_a_coordinated_jobs_worker_runs_torch_on_one_thread(self):
        before = torch.get_num_threads()
        torch.set_num_threads(4)
        self.addCleanup(torch.set_num_threads, before)
        # The pool CoordinatedLoader makes for num_workers (_ensure_pools).
        with multiprocessing.get_context("fork").Pool(2, initializer=coordinated._worker_init, initargs=(None,)) as p:
            self.assertEqual(set(p.map(_threads, range(8))), {1})
        self.assertEqual(torch.get_num_threads(), 4, "the job's own process keeps its threads")


if __name__ == "__main__":
    unittest.main()
