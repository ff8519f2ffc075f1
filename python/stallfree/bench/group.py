"""``python -m stallfree.bench --group J[,J...]``: coordinated prep versus
independent jobs (docs/api.md).

A hyper-parameter search runs J jobs on one dataset. Each job here is its
own process with a CPU-heavy real transform (JPEG decode + random resized
crop to 224x224 + flip, with Pillow). In one run, on one node:

  independent  J processes, each a torch DataLoader over CachedDataset:
               every job transforms every sample (J·N calls an epoch);
  coordinated  J processes, each a CoordinatedLoader of one group: each
               batch is prepared once and read by the others (goal: calls
               <= 1.1·N an epoch).

Jobs start, load torch, fetch nothing, then wait for a common start signal;
the epoch is timed from it. Printed per mode: transform calls per epoch,
aggregate samples/s (J·N·epochs over the slowest job's time) and CPU per
delivered sample (the jobs' user+system time, their worker processes
included, plus the node's). Goal: coordinated aggregate >= 0.8·J x the
independent one when prep-bound (the machine's cores busy with the
transform).

Options: --items N (256) --batch B (16) --epochs E (1) --workers W (1 per
job) --side PX (500, the JPEG's side) --window W (16) --url URL (an existing
node; default: start bin/cachenode in a temporary directory).
"""

import argparse
import io
import json
import os
import random
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


# -- the transform ---------------------------------------------------------------

class JpegCrop:
    """JPEG decode + RandomResizedCrop(224, scale=(0.08, 1), ratio=(3/4, 4/3))
    + random horizontal flip, as torchvision does it, with Pillow; returns
    an HxWx3 uint8 array. Each call appends a byte to ``counter``."""

    def __init__(self, counter, size=224):
        self.counter, self.size = counter, size

    def __call__(self, data):
        import math

        import numpy as np
        from PIL import Image

        fd = os.open(self.counter, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        os.write(fd, b"x")
        os.close(fd)
        img = Image.open(io.BytesIO(data)).convert("RGB")
        w, h = img.size
        area = w * h
        box = (0, 0, w, h)
        for _ in range(10):
            target = area * random.uniform(0.08, 1.0)
            ratio = math.exp(random.uniform(math.log(3 / 4), math.log(4 / 3)))
            cw, ch = int(round(math.sqrt(target * ratio))), int(round(math.sqrt(target / ratio)))
            if 0 < cw <= w and 0 < ch <= h:
                x, y = random.randint(0, w - cw), random.randint(0, h - ch)
                box = (x, y, x + cw, y + ch)
                break
        img = img.resize((self.size, self.size), Image.BILINEAR, box=box)
        if random.random() < 0.5:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        return np.array(img)  # writable (torch warns on read-only arrays)


def make_jpegs(root, n, side, seed=1):
    """n JPEGs of side x side: smooth colour fields with noise, ~quality 90."""
    import numpy as np
    from PIL import Image

    os.makedirs(root, exist_ok=True)
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:side, 0:side].astype(np.float32) / side
    for i in range(n):
        a, b, c = rng.random(3)
        base = np.stack([np.sin(6 * (a * xx + b * yy) + c), np.cos(5 * (b * xx - a * yy)), (xx + yy) / 2], -1)
        img = ((base * 0.5 + 0.5) * 200 + rng.normal(0, 12, (side, side, 3))).clip(0, 255).astype(np.uint8)
        Image.fromarray(img).save(os.path.join(root, f"img{i:05d}.jpg"), quality=90)


# -- one job (a process of its own) ----------------------------------------------

def cpu_seconds():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime


def run_job(a):
    import torch.utils.data  # noqa: F401 - loaded before the start signal, in both modes

    from stallfree.torch import CachedDataset, CoordinatedLoader

    transform = JpegCrop(a.counter)
    if a.mode == "independent":
        ds = CachedDataset(a.url, a.dataset, transform=transform)
        g = torch.Generator()
        g.manual_seed(a.job)
        loader = torch.utils.data.DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers, generator=g)
    else:
        loader = CoordinatedLoader(a.url, a.group_name, a.job, a.dataset, transform, a.batch, a.workers,
                                   jobs=a.jobs, seed=3, window=a.window)
    print("ready", flush=True)
    sys.stdin.readline()  # the common start
    t0, c0 = time.monotonic(), cpu_seconds()
    samples = 0
    for epoch in range(a.epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(epoch)
        for batch in loader:
            samples += len(batch)
    if hasattr(loader, "close"):
        loader.close()  # reaps the workers, so their CPU is counted
    del loader
    print(json.dumps({"job": a.job, "seconds": time.monotonic() - t0, "cpu": cpu_seconds() - c0, "samples": samples,
                      "alone": False}), flush=True)


# -- the driver --------------------------------------------------------------------

def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def proc_cpu(pid):
    """User+system seconds of a process, from /proc (0 when unknown)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def run_mode(a, mode, jobs, tmp, node_pid):
    counter = os.path.join(tmp, f"{mode}-{jobs}.calls")
    group = f"bench-{jobs}-{os.getpid()}-{int(time.time())}"
    procs = []
    for j in range(jobs):
        args = [sys.executable, "-m", "stallfree.bench.group", "--worker", "--mode", mode, "--url", a.url,
                "--dataset", a.dataset, "--counter", counter, "--job", str(j), "--jobs", str(jobs), "--batch", str(a.batch),
                "--workers", str(a.workers), "--epochs", str(a.epochs), "--window", str(a.window), "--group-name", group]
        procs.append(subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      cwd=os.path.join(ROOT, "python")))
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a {mode} job did not start")
        n0 = proc_cpu(node_pid)
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        res = [json.loads(p.stdout.readline()) for p in procs]
        node_cpu = proc_cpu(node_pid) - n0
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    calls = os.path.getsize(counter) if os.path.exists(counter) else 0
    samples = sum(r["samples"] for r in res)
    wall = max(r["seconds"] for r in res)
    cpu = sum(r["cpu"] for r in res) + node_cpu
    return {"mode": mode, "jobs": jobs, "calls_per_epoch": calls / a.epochs, "samples": samples, "seconds": wall,
            "samples_per_s": samples / wall, "cpu_ms_per_sample": 1000 * cpu / samples, "node_cpu_s": node_cpu}


def start_node(tmp, data):
    binary = os.environ.get("STALLFREE_BIN", os.path.join(ROOT, "bin", "cachenode"))
    if not os.path.exists(binary):
        sys.exit(f"{binary} not found: run `make build` first, or pass --url")
    http = free_port()
    args = [binary, "--name", "bench", "--http", f"127.0.0.1:{http}", "--peer", f"127.0.0.1:{free_port()}",
            "--gossip", f"127.0.0.1:{free_port()}", "--raft", f"127.0.0.1:{free_port()}", "--data-dir",
            os.path.join(tmp, "node"), "--memory", "1GiB", "--fast-timers", "--log-level", "warn",
            "--dataset", f"jpegs={data}"]
    log = open(os.path.join(tmp, "node.log"), "w")
    proc = subprocess.Popen(args, stdout=log, stderr=log)
    return proc, f"http://127.0.0.1:{http}"


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m stallfree.bench --group")
    ap.add_argument("--group", default="4,8", help="job counts J, comma-separated")
    ap.add_argument("--items", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--side", type=int, default=500)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--url", default="")
    ap.add_argument("--dataset", default="jpegs")
    # a job process
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--counter", help=argparse.SUPPRESS)
    ap.add_argument("--job", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--jobs", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--group-name", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return run_job(a)

    sys.path.insert(0, os.path.join(ROOT, "python"))
    from stallfree import Client

    tmp = tempfile.mkdtemp(prefix="stallfree-bench-group")
    node = None
    try:
        data = os.path.join(tmp, "jpegs")
        make_jpegs(data, a.items, a.side)
        if a.url:
            Client(a.url).json("PUT", f"/v1/datasets/{a.dataset}", {"source": data})
            node_pid = 0
        else:
            node, a.url = start_node(tmp, data)
            node_pid = node.pid
        c = Client(a.url)
        deadline = time.time() + 60
        while True:
            try:
                c.dataset(a.dataset)
                break
            except Exception:  # noqa: BLE001 - starting
                if time.time() > deadline:
                    raise
                time.sleep(0.1)
        size = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data))
        print(f"coordinated prep bench: {a.items} JPEGs of {a.side}x{a.side} ({size / a.items / 1024:.0f} KiB avg), "
              f"batch {a.batch}, {a.epochs} epoch(s), {a.workers} worker(s) per job, window {a.window}; "
              f"load before: {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
        rows = []
        for jobs in [int(x) for x in str(a.group).split(",") if x]:
            ind = run_mode(a, "independent", jobs, tmp, node_pid)
            coo = run_mode(a, "coordinated", jobs, tmp, node_pid)
            rows += [ind, coo]
            ratio = coo["samples_per_s"] / ind["samples_per_s"]
            for r in (ind, coo):
                print(f"J={jobs:<2} {r['mode']:<12} transform calls/epoch {r['calls_per_epoch']:7.0f} "
                      f"({r['calls_per_epoch'] / a.items:.2f} N)  aggregate {r['samples_per_s']:7.1f} samples/s  "
                      f"CPU {r['cpu_ms_per_sample']:6.2f} ms/sample  ({r['seconds']:.1f} s)")
            print(f"J={jobs:<2} coordinated/independent aggregate {ratio:.2f}x (goal >= {0.8 * jobs:.1f}x); "
                  f"calls {coo['calls_per_epoch'] / a.items:.2f} N (goal <= 1.10 N); load now {os.getloadavg()[0]:.2f}")
        print(json.dumps({"results": rows}))
    finally:
        if node is not None:
            node.terminate()
            node.wait(timeout=15)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
