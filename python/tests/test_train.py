"""python/examples/train.py, run as README says, against a real node: it
trains, stops, resumes from its own checkpoint at the exact sample, and prints
loss and data stall per epoch. And the claim README makes about torch's
DataLoader and __getitems__, checked on the torch installed here."""

import json
import os
import random
import subprocess
import sys

import torch.utils.data

from harness import ROOT, Cluster, ClusterCase, wait_until

from stallfree import Client
from stallfree.torch import CachedDataset, LocalitySampler

TRAIN = os.path.join(ROOT, "python", "examples", "train.py")
JOB = "train-example"  # train.py's --job default


class TrainExampleTest(ClusterCase):
    ITEMS, BATCH = 320, 16

    def setUp(self):
        self.make_tmp("stallfree-train")
        self.cluster = Cluster(self.tmp, n=1)
        self.url = self.cluster.nodes[0][1]
        # Images whose class shows (class k: pixel values in [25k, 25k+25)),
        # so that a falling loss means the example trains, not that it
        # memorises noise (cachectl gendata's bytes are uniform noise).
        self.data = os.path.join(self.tmp, "imgs")
        rnd = random.Random(5)
        for i in range(self.ITEMS):
            k = i % 10
            os.makedirs(os.path.join(self.data, f"class{k:03d}"), exist_ok=True)
            with open(os.path.join(self.data, f"class{k:03d}", f"img_{i:07d}.bin"), "wb") as f:
                f.write(bytes(25 * k + rnd.randrange(25) for _ in range(1024 + rnd.randrange(1024))))
        c = Client(self.url)
        wait_until(lambda: c.json("PUT", "/v1/datasets/imgs", {"source": self.data}), 30, "registration")

    def train(self, *extra):
        out = subprocess.run([sys.executable, TRAIN, "--url", self.url, "--dataset", "imgs", "--epochs", "3",
                              "--batch-size", str(self.BATCH), "--checkpoint", os.path.join(self.tmp, "ckpt.pt"),
                              *extra], capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return out.stdout.splitlines()

    def test_trains_stops_and_resumes_from_its_checkpoint(self):
        first = self.train("--max-steps", "7")
        self.assertEqual(first[-1], f"stopping after 7 steps at epoch 0, position {7 * self.BATCH}")
        second = self.train()
        self.assertEqual(second[0], f"resumed from {os.path.join(self.tmp, 'ckpt.pt')}: epoch 0, position {7 * self.BATCH}")
        epochs = [json.loads(line) for line in second[1:]]
        self.assertEqual([e["epoch"] for e in epochs], [0, 1, 2])
        # The interrupted epoch continues at its sample: nothing repeated or skipped.
        self.assertEqual((epochs[0]["resumed_at"], epochs[0]["samples"]), (7 * self.BATCH, self.ITEMS - 7 * self.BATCH))
        self.assertEqual([e["samples"] for e in epochs[1:]], [self.ITEMS, self.ITEMS])
        for e in epochs:
            self.assertGreater(e["loss"], 0)
            self.assertGreaterEqual(e["stall_s"], 0)
        # It learns: the loss falls, from chance (ln 10 = 2.30) towards 0.
        self.assertLess(epochs[2]["loss"], epochs[1]["loss"])
        self.assertLess(epochs[2]["loss"], 2.0)
        # The stall meter reported to the node.
        metrics = Client(self.url).request("GET", "/metrics")[1].decode()
        self.assertIn('stallfree_loader_wait_seconds_total', metrics)
        # The end of the last epoch was reported: jobs ls shows the next one.
        positions = Client(self.url).json("GET", f"/v1/jobs/{JOB}/positions")
        self.assertEqual([(p["epoch"], p["position"]) for p in positions], [(3, 0)])
        # Run again when done: nothing left to train, and it says so.
        ckpt = os.path.join(self.tmp, "ckpt.pt")
        self.assertEqual(self.train(), [f"resumed from {ckpt}: epoch 3, position 0",
                                        f"nothing left to do: {ckpt} has finished 3 epochs of --epochs 3; "
                                        "raise --epochs, or delete it to start over"])
        # Another job's run on this checkpoint says what to do, not a traceback.
        out = subprocess.run([sys.executable, TRAIN, "--url", self.url, "--dataset", "imgs", "--job", "another",
                              "--checkpoint", os.path.join(self.tmp, "ckpt.pt")], capture_output=True, text=True, timeout=300)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("is another run's checkpoint", out.stderr)
        self.assertIn("delete it or give --checkpoint PATH", out.stderr)
        self.assertNotIn("Traceback", out.stderr)

    def test_dataloader_fetches_each_minibatch_in_one_request(self):
        # README: on the torch installed here (Debian 12: 1.13) a plain
        # DataLoader(batch_size=N) hands each minibatch to __getitems__.
        name = Client(self.url).json("GET", "/v1/cluster")["self"]
        Client(self.url).json("PUT", "/v1/jobs/plain", {"dataset": "imgs", "seed": 1, "world_size": 1,
                                                        "batch_size": self.BATCH, "ranks": [name]})
        ds = CachedDataset(self.url, "imgs")
        calls = []
        request = ds.client.request
        ds.client.request = lambda *a, **kw: calls.append(a[:2]) or request(*a, **kw)
        sampler = LocalitySampler(self.url, "plain", 0)
        loader = torch.utils.data.DataLoader(ds, batch_size=self.BATCH, sampler=sampler, collate_fn=list)
        got = sum(len(b) for b in loader)
        self.assertEqual(got, self.ITEMS)
        self.assertEqual(len(calls), self.ITEMS // self.BATCH, f"torch {torch.__version__}: {calls[:3]}")
        self.assertTrue(all(m == "POST" and p.endswith("/batch") for m, p in calls))


class ReadmeSnippetsTest(__import__("unittest").TestCase):
    def test_readme_snippets_are_the_examples_lines(self):
        import re
        with open(TRAIN) as f:
            train = f.read()
        with open(os.path.join(ROOT, "README.md")) as f:
            blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
        names = re.findall(r"# \[readme:(\w+)\]", train)
        self.assertEqual(names, ["loader", "resume", "epoch"])
        for name in names:
            m = re.search(r"( *)# \[readme:%s\]\n(.*?)\n *# \[/readme:%s\]" % (name, name), train, re.S)
            lines = "\n".join(line[len(m.group(1)):] for line in m.group(2).split("\n")) + "\n"
            self.assertIn(lines, blocks, f"README has no python block with train.py's {name} lines")
