"""A complete small training job on a Stallfree dataset: a real CNN, optimizer
and loss, fed through CachedDataset + LocalitySampler + StallMeter, resumable
from its own checkpoint, printing loss and data stall per epoch.

    bin/cachectl gendata /tmp/small --items 2000 --size 4KiB
    bin/cachectl datasets add small /tmp/small
    /usr/bin/python3 python/examples/train.py --url http://127.0.0.1:7070 --dataset small --epochs 5

(Debian's /usr/bin/python3, which has python3-torch and python3-numpy; see
README.md, "Python loader".)

Items are read as 32x32 grayscale images (the first 1024 bytes, zero-padded);
the label is the item's class folder (class003/... -> 3), or a WebDataset
sample's .cls. Run it again after an interruption and it continues from
--checkpoint (by default ~/.cache/stallfree/train-example.pt, under
$XDG_CACHE_HOME when set: never in the checkout), at the exact sample it had
reached. Delete it to start over with other arguments.
"""

import argparse
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.utils.data

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stallfree import Client  # noqa: E402
from stallfree.torch import CachedDataset, LocalitySampler, StallMeter  # noqa: E402

SIDE = 32


def to_sample(key, data):
    """(1x32x32 float tensor, class) from an item's key and bytes."""
    x = np.zeros(SIDE * SIDE, dtype=np.uint8)
    b = np.frombuffer(data[:SIDE * SIDE], dtype=np.uint8)
    x[:len(b)] = b
    folder = key.split("/", 1)[0]
    label = int("".join(c for c in folder if c.isdigit()) or 0)
    return torch.from_numpy(x.astype(np.float32) / 255.0).view(1, SIDE, SIDE), label


def from_tar(sample):
    return to_sample("class" + sample["cls"].decode().strip(), sample["jpg"])


class SmallCNN(nn.Module):
    def __init__(self, classes):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 16x16
            nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 8x8
            nn.Flatten(), nn.Linear(32 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, classes))

    def forward(self, x):
        return self.net(x)


def ensure_job(url, job, dataset, batch_size, seed):
    """Registers a one-rank job on this node (idempotent) and returns its rank."""
    c = Client(url)
    me = c.json("GET", "/v1/cluster")["self"]
    c.json("PUT", f"/v1/jobs/{job}", {"dataset": dataset, "seed": seed, "world_size": 1,
                                      "batch_size": batch_size, "ranks": [me]})
    return 0


def default_checkpoint():
    """~/.cache/stallfree/train-example.pt ($XDG_CACHE_HOME when set): a
    path outside the checkout, the same from any directory."""
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "stallfree", "train-example.pt")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--url", default="http://127.0.0.1:7070", help="this machine's node")
    p.add_argument("--dataset", default="imgs")
    p.add_argument("--job", default="train-example")
    p.add_argument("--epochs", type=int, default=5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--checkpoint", default=default_checkpoint(),
                   help="where the checkpoint is kept (default: %(default)s)")
    p.add_argument("--checkpoint-every", type=int, default=50, help="steps between checkpoints")
    p.add_argument("--max-steps", type=int, default=0, help="stop (checkpointed) after this many steps of this run")
    args = p.parse_args(argv)
    os.makedirs(os.path.dirname(os.path.abspath(args.checkpoint)), exist_ok=True)
    torch.manual_seed(0)

    url, bs = args.url, args.batch_size
    rank = ensure_job(url, args.job, args.dataset, bs, seed=42)
    model = SmallCNN(args.classes)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()

    # [readme:loader]
    ds = CachedDataset(url, args.dataset, transform=to_sample, with_key=True)
    if ds.tar:  # WebDataset shards: samples are dicts with the class in .cls
        ds = CachedDataset(url, args.dataset, transform=from_tar)
    sampler = LocalitySampler(url, args.job, rank=rank)   # like DistributedSampler
    loader = torch.utils.data.DataLoader(ds, batch_size=bs, sampler=sampler, num_workers=args.workers)
    # [/readme:loader]

    # [readme:resume]
    start_epoch = 0
    if os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        try:
            sampler.load_state_dict(ckpt["sampler"])
        except ValueError as e:  # another job, generation or rank than this run's
            sys.exit(f"{args.checkpoint} is another run's checkpoint ({e}): delete it or give --checkpoint PATH")
        start_epoch = ckpt["sampler"]["epoch"]
        print(f"resumed from {args.checkpoint}: epoch {start_epoch}, position {ckpt['sampler']['position']}", flush=True)
    # [/readme:resume]

    steps = 0
    for epoch in range(start_epoch, args.epochs):
        # [readme:epoch]
        sampler.set_epoch(epoch)                 # after load_state_dict: the same epoch, from its position
        skipped = sampler.state_dict(consumed=0)["position"]
        meter = StallMeter(url, loader, job=args.job, rank=rank)
        total, seen, began = 0.0, 0, time.perf_counter()
        for b, (x, y) in enumerate(meter, start=1):
            optimizer.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            optimizer.step()
            total, seen, steps = total + loss.item() * len(y), seen + len(y), steps + 1
            if b % args.checkpoint_every == 0 or steps == args.max_steps:
                # What the loop consumed, not what the workers prefetched.
                state = sampler.state_dict(consumed=seen)
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "sampler": state},
                           args.checkpoint)
                sampler.report(state)            # cachectl jobs ls shows the position
            if steps == args.max_steps:
                print(f"stopping after {steps} steps at epoch {epoch}, position {skipped + seen}", flush=True)
                return 0
        elapsed = time.perf_counter() - began
        print(json.dumps({"epoch": epoch, "samples": seen, "resumed_at": skipped, "loss": round(total / max(seen, 1), 4),
                          "stall_s": round(meter.wait_seconds, 3), "stall_pct": round(100 * meter.wait_seconds / elapsed, 1),
                          "seconds": round(elapsed, 2)}), flush=True)
        # [/readme:epoch]
        # The next epoch from its start: not resumed from an old generation,
        # whatever this one was.
        state = {**sampler.state_dict(consumed=seen), "epoch": epoch + 1, "position": 0}
        state.pop("resumed_from", None)
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "sampler": state}, args.checkpoint)
        sampler.report(state)                    # jobs ls: the next epoch, from its start
    if start_epoch >= args.epochs:
        print(f"nothing left to do: {args.checkpoint} has finished {start_epoch} epochs of --epochs {args.epochs}; "
              "raise --epochs, or delete it to start over", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
