"""One job of a coordinated-prep group, run as its own process by
test_coordinated.py: iterates epochs with a CoordinatedLoader and writes,
per batch, its indices and a digest of its bytes (one JSON line each) to
--out; every transform call appends a line to --calls."""

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


def main():
    ap = argparse.ArgumentParser()
    for a in ("url", "group", "dataset", "out", "calls"):
        ap.add_argument("--" + a, required=True)
    for a, d in (("job", 0), ("jobs", 1), ("batch", 4), ("window", 4), ("epochs", 1), ("workers", 0)):
        ap.add_argument("--" + a, type=int, default=d)
    ap.add_argument("--wait", type=float, default=30.0)
    ap.add_argument("--stop-after", type=int, default=0, help="SIGSTOP this process after that many batches")
    args = ap.parse_args()

    def transform(data):
        # The item's index is its first six bytes; the augmentation draws
        # from the seeded generators, as a random crop would.
        with open(args.calls, "a") as f:
            f.write(f"{args.job}\n")
        return np.array([int(data[:6]), random.random(), np.random.random()])

    loader = CoordinatedLoader(args.url, args.group, args.job, args.dataset, transform, args.batch, args.workers,
                               jobs=args.jobs, seed=7, window=args.window, wait=args.wait)
    with open(args.out, "w") as out:
        for epoch in range(args.epochs):
            loader.set_epoch(epoch)
            for b, batch in enumerate(loader):
                rec = {"epoch": epoch, "batch": b, "indices": [int(x) for x in batch[:, 0]],
                       "digest": hashlib.sha256(encode_batch(batch)).hexdigest(), "alone": loader.alone}
                out.write(json.dumps(rec) + "\n")
                out.flush()
                if epoch == 0 and b + 1 == args.stop_after:
                    os.kill(os.getpid(), signal.SIGSTOP)
        out.write(json.dumps({"done": True, "alone": loader.alone, "len": len(loader)}) + "\n")
    loader.close()


if __name__ == "__main__":
    main()
