"""Trains a small CNN for 3 epochs through ``BatchLoader`` over three kinds of
dataset (a directory, an S3 bucket on MinIO, WebDataset tar shards) and
prints the share of the loop's time spent waiting for data, against the same
loop reading the files directly (a plain Dataset in a 2-worker DataLoader).

    make build
    /usr/bin/python3 python/examples/train_stall.py [--items 4096] [--minio PATH]

from the checkout's root, on Debian's /usr/bin/python3 (python3-torch,
python3-numpy, python3-msgpack; a pyenv python3 earlier on PATH lacks them).

Self-contained: it writes a dataset of 32x32 RGB images with labels, starts
one ``bin/cachenode`` (and MinIO, from ``--minio`` or ``$STALLFREE_MINIO`` or
``scripts/minio.sh``), registers ``dir``, ``s3`` and ``tar`` datasets, warms
them up and trains. The wait share is ``StallMeter``'s: time the loop spent in
``next()`` over the epoch's wall time.
"""

import argparse
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time

import numpy as np
import torch
import torch.nn as nn
import torch.utils.data as tud

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from stallfree import Client  # noqa: E402
from stallfree.torch import BatchLoader, CachedDataset, StallMeter  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SIDE, CLASSES = 32, 10
S3_USER, S3_PASSWORD = "stallfree-example", "stallfree-example-secret"


# -- the data ---------------------------------------------------------------------

def make_samples(n, seed=7):
    """n (label, pixels) pairs; pixels are SIDE*SIDE*3 bytes whose mean
    depends on the label, so the CNN has something to learn."""
    rnd = np.random.default_rng(seed)
    out = []
    for i in range(n):
        label = i % CLASSES
        img = rnd.normal(100 + 12 * label, 40, SIDE * SIDE * 3).clip(0, 255).astype(np.uint8)
        out.append((label, img.tobytes()))
    return out


def item_key(i, label):
    return f"c{label}/s{i:06d}.bin"


def write_dir(root, samples):
    """One file per sample: its label byte, then the pixels."""
    for i, (label, px) in enumerate(samples):
        p = os.path.join(root, item_key(i, label))
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(bytes([label]) + px)


def write_tars(root, samples, per_shard=256):
    """WebDataset shards: sample s{i} is members s{i}.img and s{i}.cls."""
    os.makedirs(root, exist_ok=True)
    for start in range(0, len(samples), per_shard):
        with tarfile.open(os.path.join(root, f"train-{start // per_shard:06d}.tar"), "w") as tf:
            for i in range(start, min(start + per_shard, len(samples))):
                label, px = samples[i]
                for name, data in ((f"s{i:06d}.img", px), (f"s{i:06d}.cls", str(label).encode())):
                    ti = tarfile.TarInfo(name)
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))


def decode_item(b):
    """dir and S3 items: label byte + pixels -> (float image, label)."""
    x = torch.frombuffer(bytearray(b[1:]), dtype=torch.uint8).view(SIDE, SIDE, 3).permute(2, 0, 1)
    return x.float().div_(255), int(b[0])


def decode_sample(s):
    """tar samples: {"__key__", "img", "cls"} -> (float image, label)."""
    x = torch.frombuffer(bytearray(s["img"]), dtype=torch.uint8).view(SIDE, SIDE, 3).permute(2, 0, 1)
    return x.float().div_(255), int(s["cls"])


class FileDataset(tud.Dataset):
    """The direct way: open and read each file."""

    def __init__(self, root):
        self.paths = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs)

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return decode_item(f.read())


# -- processes --------------------------------------------------------------------

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def await_ok(f, timeout, what):
    deadline = time.time() + timeout
    while True:
        try:
            r = f()
            if r:
                return r
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if time.time() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


class Minio:
    """A MinIO server on loopback, for the s3:// dataset."""

    def __init__(self, binary, tmp):
        self.endpoint = f"http://127.0.0.1:{free_port()}"
        env = dict(os.environ, MINIO_ROOT_USER=S3_USER, MINIO_ROOT_PASSWORD=S3_PASSWORD, MINIO_BROWSER="off",
                   MINIO_UPDATE="off", HOME=tmp)
        self.log = open(os.path.join(tmp, "minio.log"), "w")
        self.proc = subprocess.Popen([binary, "server", os.path.join(tmp, "minio-data"), "--address",
                                      self.endpoint[len("http://"):], "--console-address", f"127.0.0.1:{free_port()}",
                                      "--quiet"], stdout=self.log, stderr=self.log, env=env)
        import urllib.request
        await_ok(lambda: urllib.request.urlopen(self.endpoint + "/minio/health/live", timeout=2).status == 200,
                 60, "MinIO")

    def upload(self, bucket, prefix, root):
        import boto3
        s3 = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=S3_USER,
                          aws_secret_access_key=S3_PASSWORD, region_name="us-east-1")
        s3.create_bucket(Bucket=bucket)
        for dp, _, fs in os.walk(root):
            for f in fs:
                p = os.path.join(dp, f)
                s3.upload_file(p, bucket, prefix + "/" + os.path.relpath(p, root))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


class Node:
    """One cachenode on loopback (reading S3 from MinIO when given)."""

    def __init__(self, tmp, minio=None, binary=None):
        binary = binary or os.environ.get("STALLFREE_BIN", os.path.join(ROOT, "bin", "cachenode"))
        self.url = f"http://127.0.0.1:{free_port()}"
        args = [binary, "--name", "example", "--bootstrap", "--http", self.url[len("http://"):],
                "--peer", f"127.0.0.1:{free_port()}", "--gossip", f"127.0.0.1:{free_port()}",
                "--raft", f"127.0.0.1:{free_port()}", "--data-dir", os.path.join(tmp, "node"),
                "--memory", "256MiB", "--fast-timers", "--log-level", "warn"]
        env = dict(os.environ)
        if minio:
            args += ["--s3-endpoint", minio.endpoint]
            env.update(AWS_ACCESS_KEY_ID=S3_USER, AWS_SECRET_ACCESS_KEY=S3_PASSWORD)
        self.log = open(os.path.join(tmp, "node.log"), "w")
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log, env=env)
        c = Client(self.url)
        await_ok(lambda: c.json("GET", "/v1/cluster")["leader"], 30, "the node")

    def add(self, name, source):
        """Registers and warms up a dataset."""
        c = Client(self.url)
        await_ok(lambda: c.json("PUT", f"/v1/datasets/{name}", {"source": source}), 60, f"registering {name}")
        c.json("POST", f"/v1/datasets/{name}/warmup")
        await_ok(lambda: (lambda p: not p["running"] and p["done"] >= p["total"])(
            c.json("GET", f"/v1/datasets/{name}/warmup")), 120, f"warming {name}")

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def minio_binary(explicit=None):
    if explicit or os.environ.get("STALLFREE_MINIO"):
        return explicit or os.environ["STALLFREE_MINIO"]
    return subprocess.run([os.path.join(ROOT, "scripts", "minio.sh")], check=True, capture_output=True,
                          text=True).stdout.strip()


# -- training ---------------------------------------------------------------------

class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Flatten(), nn.Linear(32 * (SIDE // 4) ** 2, CLASSES))

    def forward(self, x):
        return self.net(x)


def train(loader, url, job, epochs=3, seed=0):
    """Trains a fresh SmallCNN over loader; per epoch: samples, labels seen
    (a count per class), wait seconds, wall seconds and the mean loss."""
    torch.manual_seed(seed)
    model = SmallCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    out = []
    for epoch in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        meter = StallMeter(url, loader, job=job)
        t0 = time.perf_counter()
        samples, losses, per_class = 0, [], [0] * CLASSES
        for x, y in meter:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            samples += len(y)
            losses.append(loss.item())
            for c in y.tolist():
                per_class[c] += 1
        wall = time.perf_counter() - t0
        out.append({"epoch": epoch, "samples": samples, "per_class": per_class, "wait_s": meter.wait_seconds,
                    "wall_s": wall, "wait_share": meter.wait_seconds / wall, "loss": sum(losses) / len(losses)})
    return out


def loaders(node_url, dir_root, batch, threads=4, workers=2, datasets=("dir", "s3", "tar")):
    """name -> (loader, the node URL its StallMeter reports to)."""
    out = {}
    for name in datasets:
        ds = CachedDataset(node_url, name)
        out[name] = BatchLoader(ds, batch, shuffle=True, threads=threads,
                                transform=decode_sample if ds.tar else decode_item)
    out["direct"] = tud.DataLoader(FileDataset(dir_root), batch_size=batch, shuffle=True, num_workers=workers)
    return out


def setup(tmp, items, minio_bin=None):
    """Data on disk, MinIO and a node with dir, s3 and tar datasets."""
    samples = make_samples(items)
    dir_root, tar_root = os.path.join(tmp, "dir"), os.path.join(tmp, "tar")
    write_dir(dir_root, samples)
    write_tars(tar_root, samples)
    minio = Minio(minio_bin or minio_binary(), tmp)
    try:
        minio.upload("example", "train", dir_root)
        node = Node(tmp, minio)
    except BaseException:
        minio.stop()
        raise
    try:
        node.add("dir", "dir://" + dir_root)
        node.add("s3", "s3://example/train")
        node.add("tar", "tar+dir://" + tar_root)
    except BaseException:
        node.stop()
        minio.stop()
        raise
    return samples, dir_root, minio, node


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=4096)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--minio", help="MinIO server binary (default $STALLFREE_MINIO, else scripts/minio.sh)")
    a = p.parse_args(argv)
    tmp = tempfile.mkdtemp(prefix="stallfree-example-")
    try:
        _, dir_root, minio, node = setup(tmp, a.items, a.minio)
        try:
            print(f"{a.items} images 32x32, batch {a.batch}, {a.epochs} epochs; wait share = time in next() / epoch time")
            print("| loop | " + " | ".join(f"epoch {e + 1}" for e in range(a.epochs)) + " | final loss |")
            print("|---|" + "---|" * (a.epochs + 1))
            for name, loader in loaders(node.url, dir_root, a.batch).items():
                res = train(loader, node.url, job=f"example-{name}", epochs=a.epochs)
                label = "files read directly (DataLoader, 2 workers)" if name == "direct" else f"BatchLoader, {name}"
                print(f"| {label} | " + " | ".join(f"{r['wait_share'] * 100:.1f}%" for r in res) +
                      f" | {res[-1]['loss']:.3f} |", flush=True)
        finally:
            node.stop()
            minio.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
