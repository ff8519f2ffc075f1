"""python -m stallfree.bench --group, tiny: every row (independent,
staging, hand-off, prep-fill, prep-cache) runs its jobs through a real node
and reports transform calls, samples/s and CPU per consumed sample."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

from harness import BIN, ROOT

sys.path.insert(0, os.path.join(ROOT, "python"))

from stallfree.bench.group import await_quiet  # noqa: E402

try:
    import PIL  # noqa: F401
except ImportError:  # pragma: no cover
    PIL = None


@unittest.skipIf(PIL is None, "the group bench makes and decodes JPEGs with Pillow")
class GroupBenchTest(unittest.TestCase):
    def test_every_row_runs_and_reports(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), STALLFREE_BIN=BIN)
        n, jobs, epochs = 32, 2, 2
        with tempfile.TemporaryDirectory(prefix="stallfree-groupbench") as cwd:
            out = subprocess.run([sys.executable, "-W", "ignore", "-m", "stallfree.bench", "--group", str(jobs),
                                  "--items", str(n), "--width", "64", "--height", "48", "--crop", "32", "--batch", "8",
                                  "--epochs", str(epochs), "--memory", "256MiB", "--json"],
                                 cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr[-3000:])
        rep = json.loads(out.stdout)
        rows = {r["row"]: r for r in rep["results"]}
        self.assertEqual(list(rows), ["independent", "staging", "hand-off", "prep-fill", "prep-cache"])
        calls = {"independent": jobs * n, "staging": n, "hand-off": 0, "prep-fill": n, "prep-cache": 0}
        routes = {"independent": [], "staging": ["staging"], "hand-off": ["staging"], "prep-fill": ["staging"],
                  "prep-cache": ["prep-cache"]}
        for name, r in rows.items():
            self.assertEqual(r["calls_per_epoch"], calls[name], name)
            self.assertEqual(r["samples"], jobs * n * (1 if name == "prep-fill" else epochs), name)
            self.assertEqual(r["routes"], routes[name], name)
            self.assertEqual(r["detached"], 0, name)
            self.assertGreater(r["samples_per_s"], 0, name)
            self.assertGreaterEqual(r["node_cpu_ms_per_sample"], 0, name)
            self.assertGreater(r["cpu_ms_per_sample"], 0, name)
            self.assertEqual(r["waited_for_quiet_s"], 0.0, name)  # no --quiet-wait
        self.assertEqual(rows["independent"]["cpu_vs_independent"], 1.0)
        # Where the CPU goes: F timed in every row that runs it, A in every
        # row that augments; the hand-off row runs neither.
        for name, r in rows.items():
            runs_f, runs_a = calls[name] > 0, name != "hand-off"
            self.assertEqual(r["f_ms_per_call"] is not None, runs_f, name)
            self.assertEqual(r["a_ms_per_sample"] is not None, runs_a, name)
            if runs_f:
                self.assertGreater(r["f_ms_per_call"], 0, name)
                self.assertGreaterEqual(r["f_faults_per_call"], 0, name)
            if runs_a:
                self.assertGreater(r["a_ms_per_sample"], 0, name)
            self.assertGreaterEqual(r["jobs_faults_per_sample"], 0, name)
        self.assertIn("independent", out.stderr)
        self.assertIn("prep-cache", out.stderr)

    def test_a_wait_for_quiet_comes_before_the_jobs_join(self):
        """--quiet-wait longer than the node's --group-timeout: the jobs
        start after the wait, so none is detached and F still runs once per
        item (jobs that joined and then waited were detached, and each
        prepared every batch)."""
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), STALLFREE_BIN=BIN)
        n = 16
        with tempfile.TemporaryDirectory(prefix="stallfree-groupbench") as cwd:
            out = subprocess.run([sys.executable, "-W", "ignore", "-m", "stallfree.bench", "--group", "2", "--items",
                                  str(n), "--width", "64", "--height", "48", "--crop", "32", "--batch", "8",
                                  "--epochs", "1", "--memory", "256MiB", "--rows", "staging", "--quiet-wait", "3",
                                  "--quiet-load", "0", "--group-timeout", "1s", "--json"],
                                 cwd=cwd, env=env, capture_output=True, text=True, timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr[-3000:])
        (r,) = json.loads(out.stdout)["results"]
        self.assertGreaterEqual(r["waited_for_quiet_s"], 3.0)  # a load of 0 is never reached: the longest wait
        self.assertEqual((r["detached"], r["calls_per_epoch"]), (0, n))


class AwaitQuietTest(unittest.TestCase):
    """A row starts once the 1-minute load is below the bound, or after the
    longest wait (a clock and a load of its own: no real waiting)."""

    def run_with(self, loads, below, at_most):
        now, polled = [0.0], []

        def loadavg():
            polled.append(now[0])
            return (loads[min(len(polled) - 1, len(loads) - 1)], 0.0, 0.0)

        def sleep(s):
            now[0] += s
        return await_quiet(below, at_most, loadavg, sleep, lambda: now[0]), polled

    def test_waits_until_the_load_falls(self):
        self.assertEqual(self.run_with([7.7, 4.0, 2.0, 1.9, 0.5], 2.0, 60)[0], 3.0)

    def test_a_quiet_machine_starts_at_once(self):
        self.assertEqual(self.run_with([1.2], 2.0, 60), (0.0, [0.0]))

    def test_no_longer_than_the_longest_wait(self):
        waited, polled = self.run_with([9.0], 2.0, 5)
        self.assertEqual((waited, len(polled)), (5.0, 6))


if __name__ == "__main__":
    unittest.main()
