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


if __name__ == "__main__":
    unittest.main()
