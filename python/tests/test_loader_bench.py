"""python -m stallfree.bench (the loader bench), tiny: every row, (e)'s
one-buffer path included, reads the whole dataset through real nodes."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

from harness import BIN, ROOT

try:
    import torch  # noqa: F401
except ImportError:  # pragma: no cover
    torch = None


@unittest.skipIf(torch is None, "the loader bench needs torch")
class LoaderBenchTest(unittest.TestCase):
    def test_every_row_reads_every_item(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        with tempfile.TemporaryDirectory(prefix="stallfree-loaderbench") as cwd:
            out = subprocess.run([sys.executable, "-W", "ignore", "-m", "stallfree.bench", "--items", "64", "--size",
                                  "4096", "--batch", "16", "--workers", "1", "--threads", "2", "--rounds", "1",
                                  "--bin", BIN, "--json"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-3000:])
        rep = json.loads(out.stdout)
        self.assertEqual(sorted(rep["rows"]), list("abcde"))
        for k, row in rep["rows"].items():
            self.assertEqual([r["samples"] for r in row["runs"]], [64], k)  # measure() checks a whole epoch
            self.assertGreater(row["loader_cpu_us"], 0, k)
        self.assertEqual(sorted(rep["ratios"]), ["b/a", "c/a", "c/b", "d/a", "e/a"])


if __name__ == "__main__":
    unittest.main()
