"""python -m stallfree.bench --train, tiny: every row trains an epoch over
real JPEGs through a real node and reports its figures."""

import contextlib
import glob
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

from harness import BIN, ROOT

try:
    import PIL  # noqa: F401
    import torch  # noqa: F401
    import torchvision  # noqa: F401
except ImportError:  # pragma: no cover
    torchvision = None


@unittest.skipIf(torchvision is None, "the training bench needs Pillow, torch and torchvision")
class TrainBenchTest(unittest.TestCase):
    def test_every_row_runs_and_reports(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"), STALLFREE_BIN=BIN)
        with tempfile.TemporaryDirectory(prefix="stallfree-trainbench") as cwd:
            out = subprocess.run([sys.executable, "-W", "ignore", "-m", "stallfree.bench", "--train", "--items", "24",
                                  "--width", "64", "--height", "48", "--crop", "32", "--batch", "8", "--epochs", "2",
                                  "--workers", "1", "--threads", "1", "--sleep-ms", "1", "--delivery-epochs", "1",
                                  "--rows", "files,cached,batchloader,prep,device-prep,device-prep-main,device-jpeg",
                                  "--json"], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-3000:])
        rep = json.loads(out.stdout)
        self.assertEqual(list(rep["rows"]), ["files", "cached", "batchloader", "prep", "device-prep",
                                             "device-prep-main", "device-jpeg"])
        self.assertNotIn("failed", rep)
        self.assertGreater(rep["model_and_augment_alone_samples_per_s"], 0)
        for row, epochs in rep["rows"].items():
            self.assertEqual([e["samples"] for e in epochs], [24, 24], row)
            for e in epochs:
                self.assertTrue(0 <= e["stall"] <= 1, (row, e))
                self.assertGreater(e["cpu_s_per_1k"]["all"], 0, row)
                # Worker processes' page faults where there are worker processes.
                self.assertEqual(e["faults_per_sample"]["workers"] > 0, row in ("files", "cached", "batchloader",
                                                                              "prep"), (row, e))
                self.assertGreater(e["faults_per_sample"]["training_process"], 0, row)
        self.assertEqual(rep["step"], "sleep 1 ms per batch")
        # F once per item, in the epoch that fills the cache: prep's own
        # stage in its first epoch, and the device rows' stage, apart from
        # prep's, in device-prep's first (device-prep-main reads what that
        # filled). The rows without a stage count none.
        calls = {row: [e["prep_calls"] for e in epochs] for row, epochs in rep["rows"].items()}
        self.assertEqual(calls, {"files": [None, None], "cached": [None, None], "batchloader": [None, None],
                                 "prep": [24, 0], "device-prep": [24, 0], "device-prep-main": [0, 0],
                                 "device-jpeg": [None, None]})
        first = rep["first_epoch_vs_files"]
        self.assertEqual(sorted(first), ["device-prep", "prep"])
        files1 = rep["rows"]["files"][0]["cpu_s_per_1k"]["all"]
        for row, ratio in first.items():
            self.assertAlmostEqual(ratio, rep["rows"][row][0]["cpu_s_per_1k"]["all"] / files1, places=9)
        self.assertEqual([d["path"] for d in rep["delivery"]], ["mapped", "socket", "jpeg"])
        for d in rep["delivery"]:
            self.assertGreater(d["all_ms"], 0)
        self.assertEqual([d["item_bytes"] for d in rep["delivery"][:2]], [36 * 36 * 3] * 2)
        self.assertAlmostEqual(rep["delivery"][2]["item_bytes"], rep["jpeg_kib"] * 1024, delta=1)
        # The node's host: every item of the mapped rounds copied from its
        # memory, the raw JPEGs too.
        self.assertEqual([d["copied_share"] for d in rep["delivery"]], [1.0, 0.0, 1.0])

    def test_a_failing_row_is_reported_and_the_rest_run(self):
        from stallfree.bench import train

        real = train.run_row

        def run_row(row, *args):
            if row == "cached":
                raise RuntimeError("the node went away")
            return real(row, *args)

        out = io.StringIO()
        with tempfile.TemporaryDirectory(prefix="stallfree-trainbench") as cwd, \
                mock.patch.dict(os.environ, STALLFREE_BIN=BIN), mock.patch.object(train, "run_row", run_row), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            os.chdir(cwd)
            try:
                rc = train.main(["--train", "--items", "8", "--width", "64", "--height", "48", "--crop", "32",
                                 "--batch", "4", "--epochs", "1", "--workers", "0", "--step", "launches", "--sleep-ms",
                                 "1", "--delivery-epochs", "0", "--rows", "files,cached,device-prep-raw", "--json"])
            finally:
                os.chdir(ROOT)
        self.assertEqual(rc, 1)
        rep = json.loads(out.getvalue())
        self.assertEqual(rep["failed"], {"cached": "RuntimeError: the node went away"})
        self.assertEqual(list(rep["rows"]), ["files", "device-prep-raw"])
        self.assertEqual([e["samples"] for e in rep["rows"]["device-prep-raw"]], [8])
        self.assertEqual(rep["step"], "tiny torch ops standing for launches, 1 ms per batch alone")


    def test_delivery_alone_against_the_model(self):
        """device-prep-raw's uint8 (B, H, W, C) batches are no input for a
        model: with --step model it trains on a resident batch for each
        (the H200 run's row failed on a 3-channel convolution)."""
        from stallfree.bench import train

        out = io.StringIO()
        with tempfile.TemporaryDirectory(prefix="stallfree-trainbench") as cwd, \
                mock.patch.dict(os.environ, STALLFREE_BIN=BIN), \
                contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
            os.chdir(cwd)
            try:
                rc = train.main(["--train", "--items", "8", "--width", "64", "--height", "48", "--crop", "32",
                                 "--batch", "4", "--epochs", "1", "--workers", "0", "--step", "model", "--model",
                                 "small", "--device", "cpu", "--delivery-epochs", "0", "--rows", "device-prep-raw",
                                 "--json"])
            finally:
                os.chdir(ROOT)
        rep = json.loads(out.getvalue())
        self.assertEqual(rc, 0, rep.get("failed"))
        self.assertEqual([e["samples"] for e in rep["rows"]["device-prep-raw"]], [8])
        self.assertEqual(rep["step"], "small-cnn on cpu")

if __name__ == "__main__":
    unittest.main()


class MicroBenchTest(unittest.TestCase):
    def test_every_figure_is_measured(self):
        env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
        out = subprocess.run([sys.executable, "-W", "ignore", "-m", "stallfree.bench", "--micro", "--copy-mb", "8",
                              "--write-mib", "1", "--writes", "3", "--handoffs", "2", "--images", "2", "--rounds", "1", "--json"],
                             env=env, capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stderr[-3000:])
        rep = json.loads(out.stdout)
        self.assertEqual(sorted(rep["copy_s_per_gb"]), ["mmap", "mmap+populate", "preadv"])
        self.assertTrue(all(v > 0 for v in rep["copy_s_per_gb"].values()))
        self.assertEqual(sorted(rep["write_cpu_ms_per_file"]), ["kept_0", "kept_30"])
        self.assertEqual(sorted(rep["handoff_cpu_ms_per_batch16"]), ["stack_then_write", "writev"])
        self.assertTrue(all(v > 0 for v in rep["handoff_cpu_ms_per_batch16"].values()))
        if torchvision is not None:
            self.assertEqual(sorted(rep["prep_cpu_ms_per_image"]), ["augment_on_array", "decode_array", "decode_only",
                                                                   "encode", "plain_transform", "stage_f",
                                                                   "stage_f_resize_then_crop"])
        self.assertEqual(glob.glob(os.path.join(rep["shm_dir"], "stallfree-micro-*")), [], "files left behind")
