"""One job of a coordinated-prep group, run as its own process by
test_coordinated*.py: iterates epochs with a CoordinatedLoader and writes,
per batch, its indices and a digest of its bytes (one JSON line each) to
--out; every transform call (or, with --cache-stage, every call of the
stage F) appends a line to --calls."""

import argparse
import hashlib
import json
import os
import random
import signal
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import numpy as np  # noqa: E402

from stallfree.coordinated import CoordinatedLoader, encode_batch  # noqa: E402


class StageF:
    """A deterministic prep stage: a (4, 4, 3) uint8 array of the item's
    bytes, its first value the item's index (the item's first six bytes)."""

    def __init__(self, calls=None):
        self.calls = calls

    def __call__(self, data):
        if self.calls:
            with open(self.calls, "a") as f:
                f.write("F\n")
        a = np.frombuffer(hashlib.sha256(bytes(data)).digest() * 2, dtype=np.uint8)[:48].reshape(4, 4, 3).copy()
        a[0, 0, 0] = int(data[:6]) % 256
        return a


def numpy_augment(x, indices, epoch=0, seed=0):
    """A batched augmentation seeded per sample by (seed, epoch, index):
    a random gain and a random left-right flip."""
    x = np.asarray(x, dtype=np.float32)
    out = np.empty_like(x)
    for k, i in enumerate(indices):
        r = np.random.default_rng([int(seed), int(epoch), int(i)])
        v = x[k] * np.float32(r.uniform(0.5, 1.5))
        out[k] = v[:, ::-1] if r.random() < 0.5 else v
    return out


def torch_augment():
    from stallfree.torch import augment as A

    return A.Compose([A.RandomResizedCrop(3), A.RandomHorizontalFlip()])


def main():
    ap = argparse.ArgumentParser()
    for a in ("url", "group", "dataset", "out", "calls"):
        ap.add_argument("--" + a, required=True)
    for a, d in (("job", 0), ("jobs", 1), ("batch", 4), ("window", 4), ("epochs", 1), ("workers", 0)):
        ap.add_argument("--" + a, type=int, default=d)
    ap.add_argument("--wait", type=float, default=30.0)
    ap.add_argument("--stop-after", type=int, default=0, help="SIGSTOP this process after that many batches")
    ap.add_argument("--cache-stage", default="", help="read the prep stage StageF under this name (augmented)")
    ap.add_argument("--augment", default="numpy", choices=("numpy", "torch"))
    ap.add_argument("--resume-at", default="", help="E:B: after batch B of epoch E, a new loader resumes from state_dict")
    args = ap.parse_args()

    def transform(data):
        # The item's index is its first six bytes; the augmentation draws
        # from the seeded generators, as a random crop would.
        with open(args.calls, "a") as f:
            f.write(f"{args.job}\n")
        return np.array([int(data[:6]), random.random(), np.random.random()])

    def make():
        if args.cache_stage:
            aug = torch_augment() if args.augment == "torch" else numpy_augment
            return CoordinatedLoader(args.url, args.group, args.job, args.dataset, None, args.batch, args.workers,
                                     jobs=args.jobs, seed=7, window=args.window, wait=args.wait,
                                     cache_stage=(args.cache_stage, StageF(args.calls)), augment=aug)
        return CoordinatedLoader(args.url, args.group, args.job, args.dataset, transform, args.batch, args.workers,
                                 jobs=args.jobs, seed=7, window=args.window, wait=args.wait)

    resume_at = tuple(int(v) for v in args.resume_at.split(":")) if args.resume_at else None
    loader = make()
    with open(args.out, "w") as out:
        epoch, b0 = 0, 0
        while epoch < args.epochs:
            if b0 == 0:
                loader.set_epoch(epoch)
            b, resumed = b0, False
            for batch in loader:
                indices = loader.indices(epoch, b) if args.cache_stage else [int(x) for x in batch[:, 0]]
                rec = {"epoch": epoch, "batch": b, "indices": indices, "route": loader.route,
                       "digest": hashlib.sha256(encode_batch(batch)).hexdigest(), "alone": loader.alone}
                out.write(json.dumps(rec) + "\n")
                out.flush()
                b += 1
                if epoch == 0 and b == args.stop_after:
                    os.kill(os.getpid(), signal.SIGSTOP)
                if resume_at == (epoch, b):
                    state = loader.state_dict()
                    before = loader.stage_calls
                    loader.close()
                    loader = make()
                    loader.load_state_dict(state)
                    resume_at, resumed = None, True
                    out.write(json.dumps({"resumed": state, "stage_calls": before}) + "\n")
                    break
            if resumed:
                b0 = b
                continue
            epoch, b0 = epoch + 1, 0
        out.write(json.dumps({"done": True, "alone": loader.alone, "len": len(loader), "stage_calls": loader.stage_calls,
                              "calls": loader.calls, "handed_over": loader.handed_over}) + "\n")
    loader.close()


if __name__ == "__main__":
    main()
