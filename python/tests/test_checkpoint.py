"""Checkpointer against a real two-node cluster: a model and its Adam state
saved while training goes on, loaded back exactly as they were at save()."""

import copy
import os
import subprocess
import sys
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from harness import BIN, Cluster, ClusterCase, wait_until  # noqa: E402

from stallfree import Client  # noqa: E402
from stallfree.checkpoint import Checkpointer, part_names  # noqa: E402

try:
    import torch
except ImportError:  # the checkpoint tests need torch; the rest of the suite does not
    torch = None


def model_and_optimizer(seed):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    return model, opt


def train_step(model, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(32, 64, generator=g), torch.randint(0, 10, (32,), generator=g)
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def tensors(obj, prefix=""):
    """Every tensor in a nested state, by path."""
    if torch.is_tensor(obj):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from tensors(v, f"{prefix}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from tensors(v, f"{prefix}/{i}")


class GatedCheckpointer(Checkpointer):
    """Holds every upload until the test opens the gate, so the training
    loop's next step certainly runs before the save's Future resolves."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.gate = threading.Event()

    def _upload(self, *a):
        self.gate.wait(60)
        return super()._upload(*a)


@unittest.skipIf(torch is None, "needs torch")
class CheckpointTest(ClusterCase):
    def setUp(self):
        self.make_tmp("sf-ckpt-")
        self.cluster = Cluster(self.tmp, n=2)
        self.url = self.cluster.nodes[0][1]

    def assertStatesEqual(self, got, want):
        g, w = dict(tensors(got)), dict(tensors(want))
        self.assertEqual(sorted(g), sorted(w))
        self.assertTrue(w, "the state has tensors")
        for k in w:
            self.assertTrue(torch.equal(g[k], w[k]), f"tensor {k} differs")

    def test_round_trip_while_training(self):
        model, opt = model_and_optimizer(1)
        for i in range(3):
            train_step(model, opt, i)
        ck = GatedCheckpointer(self.url, "job")
        self.assertIsNone(ck.load(), "nothing committed yet")
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "step": 3}
        want = copy.deepcopy(state)
        fut = ck.save(3, state, meta={"epoch": 0})
        self.assertFalse(fut.done())
        train_step(model, opt, 3)  # the next optimizer step, before the Future resolves
        moved = [k for k, t in tensors(model.state_dict()) if not torch.equal(t, dict(tensors(want["model"]))[k])]
        self.assertTrue(moved, "the step after save() changed the weights")
        ck.gate.set()
        info = fut.result(60)
        self.assertEqual(info["step"], 3)
        self.assertEqual(info["replicas"], 2)
        # Loaded through the other node too (once its catalog has the commit):
        # any copy serves.
        other = Checkpointer(self.cluster.nodes[1][1], "job")
        wait_until(lambda: other.steps(), 10, "the commit reaching the other node")
        for url in (self.url, self.cluster.nodes[1][1]):
            got = Checkpointer(url, "job").load(map_location="cpu")
            self.assertStatesEqual(got, want)
            self.assertEqual(got["step"], 3)
        # The loaded state resumes training: the same next step as the original.
        model2, opt2 = model_and_optimizer(99)
        got = ck.load()
        model2.load_state_dict(got["model"])
        opt2.load_state_dict(got["opt"])
        train_step(model2, opt2, 3)
        self.assertStatesEqual(model2.state_dict(), model.state_dict())
        ck.close()

    def test_ranks_split_parts_and_newest_by_default(self):
        # Two ranks on two nodes; rank 1's state is split into 1 MiB parts.
        states = {r: {"w": torch.arange(300_000 * (r + 1), dtype=torch.float32) + r} for r in range(2)}
        cks = [Checkpointer(self.cluster.nodes[r][1], "ddp", rank=r, world_size=2, part_bytes=1 << 20) for r in range(2)]
        for step in (10, 20):
            futs = [cks[r].save(step, {"w": states[r]["w"] + step}) for r in (1, 0)]
            for f in futs:
                self.assertEqual(f.result(60)["step"], step)
        listing = Client(self.url).json("GET", "/v1/checkpoints/ddp")
        self.assertEqual(listing["latest"], 20)
        parts = listing["steps"][-1]["parts"]
        self.assertIn("0.0-of-2", parts)
        self.assertEqual(sorted(p for p in parts if p.startswith("1.")), sorted(part_names(1, 3)))
        for r in range(2):
            self.assertTrue(torch.equal(cks[r].load()["w"], states[r]["w"] + 20))
            self.assertTrue(torch.equal(cks[r].load(step=10)["w"], states[r]["w"] + 10))
        with self.assertRaises(KeyError):
            cks[0].load(step=5)
        for c in cks:
            c.close()

    def test_auto_interval_and_cachectl(self):
        ck = Checkpointer(self.url, "auto")
        state = {"w": torch.randn(2_000_000)}
        ck.save(1, state).result(60)
        step_time = 0.05
        k = ck.auto(step_time)
        self.assertGreaterEqual(k, 1)
        self.assertLessEqual(ck.overhead(step_time), 0.035 + 1e-9)
        self.assertGreaterEqual(k * step_time, ck.upload_seconds)
        self.assertIsNone(ck.maybe_save(k + 1, state) if k > 1 else None)
        ck.close()
        ctl = os.path.join(os.path.dirname(BIN), "cachectl")
        out = subprocess.run([ctl, "--node", self.url, "checkpoints", "ls"], capture_output=True, text=True, check=True).stdout
        self.assertIn("auto", out)
        subprocess.run([ctl, "--node", self.url, "checkpoints", "rm", "auto"], check=True)
        self.assertEqual(ck.steps(), [])


if __name__ == "__main__":
    unittest.main()
