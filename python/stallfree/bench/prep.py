"""``python -m stallfree.bench --prep``: decode once per cluster, not once per epoch.

Real JPEGs (500x375, ~110 KiB, made with Pillow) through a real DataLoader
(2 workers), three ways, in one run on one machine:

(a) a plain map-style Dataset over the files: read, F, T every epoch;
(b) ``CachedDataset`` without ``cache_stage``: the bytes from the cache, F
    and T every epoch;
(c) ``CachedDataset(cache_stage=("decoded-224-v1", F))``, epoch 2: F's
    output from the cache, only T.

F = Pillow decode + resize (shorter side 256) + center crop 224 -> uint8
array; T = random crop 192 + random horizontal flip + float tensor (CHW).
Prints samples/s and CPU seconds per sample of the loader's processes (the
training process and its workers), the cache node's CPU beside it, and F's
calls in (c)'s epoch 2 (the goal: zero).
"""

import argparse
import io
import json
import multiprocessing
import os
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from .common import proc_cpu
from .common import write_section as common_write_section

STAGE = "decoded-224-v1"


def make_jpegs(root, n, seed=0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:375, 0:500]
    sizes = 0
    for i in range(n):
        base = np.stack([x * 255 / 500, y * 255 / 375, (x + y) * 255 / 875], -1)
        base = base + 60 * np.sin(x / (7 + i % 13) + y / (11 + i % 7))[..., None]
        img = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
        d = os.path.join(root, f"class{i % 10:02d}")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, f"img_{i:06d}.jpg")
        Image.fromarray(img).save(path, "JPEG", quality=90)
        sizes += os.path.getsize(path)
    return sizes / max(n, 1)


class Counter:
    """Counts calls across DataLoader worker processes (shared memory,
    inherited by the forked workers)."""

    def __init__(self):
        self.v = multiprocessing.Value("q", 0)

    def add(self):
        with self.v.get_lock():
            self.v.value += 1

    @property
    def value(self):
        return self.v.value


class F:
    """Pillow decode + resize to 256 (shorter side) + center crop 224."""

    def __init__(self, counter):
        self.counter = counter

    def __call__(self, raw):
        from PIL import Image

        self.counter.add()
        im = Image.open(io.BytesIO(raw)).convert("RGB")
        w, h = im.size
        s = 256 / min(w, h)
        im = im.resize((max(256, round(w * s)), max(256, round(h * s))), Image.BILINEAR)
        left, top = (im.width - 224) // 2, (im.height - 224) // 2
        return np.asarray(im.crop((left, top, left + 224, top + 224)), dtype=np.uint8)


def T(arr):
    """Random crop 192 + random horizontal flip + float tensor, CHW."""
    import torch

    top, left = random.randrange(0, 33), random.randrange(0, 33)
    a = arr[top:top + 192, left:left + 192]
    if random.random() < 0.5:
        a = a[:, ::-1]
    return torch.from_numpy(np.ascontiguousarray(a)).permute(2, 0, 1).float().div_(255.0)


class FT:
    def __init__(self, f):
        self.f = f

    def __call__(self, raw):
        return T(self.f(raw))


class Files:
    """(a): the ImageFolder way, decoding every epoch."""

    def __init__(self, root, transform):
        self.paths = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs)
        self.transform = transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return self.transform(f.read())


def epoch(dataset, workers, batch, node_pid, whole_batches=False):
    """One shuffled epoch; samples are collated into one tensor per batch in
    the worker, as training does. ``whole_batches`` hands each worker the
    batch's indices at once (``__getitems__``: one request per batch), the
    way ``CachedDataset`` is meant to be used on torch < 2.0, which does not
    call ``__getitems__`` by itself."""
    import torch.utils.data

    if whole_batches:
        sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(dataset), batch, False)
        loader = torch.utils.data.DataLoader(dataset, sampler=sampler, batch_size=None, num_workers=workers,
                                             collate_fn=torch.utils.data.default_collate)
    else:
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers)
    r0, c0, n0, t0 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN), \
        proc_cpu(node_pid), time.perf_counter()
    count = sum(b.shape[0] for b in loader)
    del loader  # workers exit and are reaped: their CPU is in RUSAGE_CHILDREN
    el = time.perf_counter() - t0
    r1, c1, n1 = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN), proc_cpu(node_pid)
    cpu = (r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime) + (c1.ru_utime - c0.ru_utime + c1.ru_stime - c0.ru_stime)
    return {"samples": count, "seconds": el, "samples_per_s": count / el, "cpu_s_per_sample": cpu / count,
            "node_cpu_s_per_sample": (n1 - n0) / count}


def start_node(tmp, data, memory):
    from ..client import Client
    from ..torch import CachedDataset  # noqa: F401 - fail early without torch

    binary = os.environ.get("STALLFREE_BIN") or shutil.which("cachenode") or \
        os.path.join(os.path.dirname(__file__), "..", "..", "..", "bin", "cachenode")
    from .common import free_port

    ports = [free_port() for _ in range(4)]
    log = open(os.path.join(tmp, "node.log"), "w")
    proc = subprocess.Popen([binary, "--name", "prep-bench", "--http", f"127.0.0.1:{ports[0]}", "--peer",
                             f"127.0.0.1:{ports[1]}", "--gossip", f"127.0.0.1:{ports[2]}", "--raft",
                             f"127.0.0.1:{ports[3]}", "--data-dir", os.path.join(tmp, "node"), "--memory", memory,
                             "--fast-timers", "--log-level", "warn", "--dataset", f"imgs={data}"],
                            stdout=log, stderr=log)
    url = f"http://127.0.0.1:{ports[0]}"
    c = Client(url)
    deadline = time.time() + 60
    while True:
        try:
            c.dataset("imgs")
            return proc, url
        except Exception:  # noqa: BLE001 - not up yet
            if time.time() > deadline or proc.poll() is not None:
                proc.kill()
                raise SystemExit(f"cachenode did not come up; see {log.name}")
            time.sleep(0.1)


def measure(url, data, a, node_pid):
    """(a), (b) and (c) epochs 1 and 2, with the load average before."""
    from ..torch import CachedDataset

    res = {"load_average": open("/proc/loadavg").read().split()[:3]}
    fa, fb, fc = Counter(), Counter(), Counter()
    res["a_files"] = epoch(Files(data, FT(F(fa))), a.workers, a.batch, node_pid)
    res["b_cached_bytes"] = epoch(CachedDataset(url, "imgs", transform=FT(F(fb))), a.workers, a.batch, node_pid, True)
    staged = CachedDataset(url, "imgs", transform=T, cache_stage=(STAGE, F(fc)))
    res["c_epoch1"] = epoch(staged, a.workers, a.batch, node_pid, True)
    res["c_epoch1"]["f_calls"] = fc.value
    before = fc.value
    res["c_epoch2"] = epoch(staged, a.workers, a.batch, node_pid, True)
    res["c_epoch2"]["f_calls"] = fc.value - before
    res["speedup_c_over_a"] = res["c_epoch2"]["samples_per_s"] / res["a_files"]["samples_per_s"]
    res["cpu_c_over_a"] = res["c_epoch2"]["cpu_s_per_sample"] / res["a_files"]["cpu_s_per_sample"]
    res["goals"] = {"c >= 3x a": res["speedup_c_over_a"] >= 3, "c cpu <= a/3": res["cpu_c_over_a"] <= 1 / 3,
                    "epoch 2 F calls == 0": res["c_epoch2"]["f_calls"] == 0}
    return res


def fig(r):
    return f"{r['samples_per_s']:.0f} · {r['cpu_s_per_sample'] * 1e3:.2f}"


def row_text(n, r):
    return (f"| {n} ({r['load_average'][0]}) | {fig(r['a_files'])} | {fig(r['b_cached_bytes'])} | "
            f"{fig(r['c_epoch1'])} · F {r['c_epoch1']['f_calls']} | {fig(r['c_epoch2'])} · "
            f"{r['c_epoch2']['node_cpu_s_per_sample'] * 1e3:.2f} | {r['c_epoch2']['f_calls']} | "
            f"**{r['speedup_c_over_a']:.2f}×** | **{r['cpu_c_over_a']:.2f}×** |")


BEGIN, END = "<!-- prep-bench: written by python -m stallfree.bench --prep -->", "<!-- /prep-bench -->"


def markdown(out, argv):
    runs = out["runs"]
    met = {g: sum(r["goals"][g] for r in runs) for g in runs[0]["goals"]}
    lines = [
        "## Prep cache: decode once per cluster",
        "",
        f"`python -m stallfree.bench {' '.join(argv)}` ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
        f"stallfree/bench/prep.py): {out['items']} JPEGs of 500×375 ({out['jpeg_kib']:.0f} KiB on average) made with "
        "Pillow, one local node (parent warmed, files in the page cache), a real `torch.utils.data.DataLoader` with "
        f"{out['workers']} workers, batch {out['batch']}, shuffled, collated into one tensor per batch. F = Pillow decode + "
        "resize (shorter side 256) + center crop 224 → uint8 array; T = random crop 192 + random flip + float tensor "
        "(CHW). (a) a plain map-style Dataset over the files (read, F, T each epoch); (b) `CachedDataset` without "
        "`cache_stage` (bytes from the node, F and T each epoch); (c) `CachedDataset(cache_stage=(\"decoded-224-v1\", "
        "F))`, epoch 1 (F runs and writes back) and epoch 2 (only T), the cache fresh for each run. (b) and (c) hand "
        "each worker a whole batch (`BatchSampler`, `__getitems__`: one request per batch), as torch 1.13 does not "
        "call `__getitems__` itself. Loader CPU is the training process and its workers (`getrusage` self + reaped "
        "children), node CPU the cachenode process's, both per sample. The machine is shared with other sessions: "
        "the load average at the start of each run is beside it.",
        "",
        "| run (load) | (a) samples/s · CPU ms | (b) samples/s · CPU ms | (c) epoch 1 | (c) epoch 2 samples/s · CPU ms · "
        "node CPU ms | F calls, (c) epoch 2 | (c)/(a) samples/s | (c)/(a) CPU |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [row_text(i + 1, r) for i, r in enumerate(runs)]
    lines += [
        "",
        f"Goals, runs meeting each: (c) ≥ 3× (a) in samples/s: {met['c >= 3x a']} of {len(runs)}; (c) at most 1/3 of "
        f"(a)'s CPU per sample: {met['c cpu <= a/3']} of {len(runs)}; F called zero times in epoch 2: "
        f"{met['epoch 2 F calls == 0']} of {len(runs)}. Samples/s follow the machine's load; CPU per sample is the "
        "steadier figure. What stays in (c) is T, collation and moving float batches to the training process, which "
        "(a) pays too; a decoded 224×224×3 item is 147 KiB in the node's memory against the JPEG's ~111 KiB.",
    ]
    return "\n".join(lines) + "\n"


def write_section(doc, text):
    """Replaces this bench's section of doc (common.write_section)."""
    common_write_section(doc, BEGIN, END, text)


def main(argv):
    p = argparse.ArgumentParser(prog="python -m stallfree.bench --prep", description=__doc__.split("\n")[0])
    p.add_argument("--prep", action="store_true")
    p.add_argument("--items", type=int, default=1000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--memory", default="512MiB")
    p.add_argument("--runs", type=int, default=1, help="measure (a), (b), (c) this many times, the cache fresh each time")
    p.add_argument("--doc", metavar="FILE", help="write the figures as a section of FILE (BENCHMARKS.md), below the "
                                                  "marker make bench keeps")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    a = p.parse_args(argv)
    try:
        import PIL  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"the prep bench needs Pillow and torch ({e})")
    from ..client import Client
    from ..prep import derived_name

    tmp = tempfile.mkdtemp(prefix="stallfree-prep-bench")
    proc = None
    try:
        data = os.path.join(tmp, "jpegs")
        t0 = time.perf_counter()
        avg = make_jpegs(data, a.items)
        print(f"{a.items} JPEGs of 500x375, {avg / 1024:.0f} KiB on average, made in {time.perf_counter() - t0:.1f}s",
              file=sys.stderr)
        proc, url = start_node(tmp, data, a.memory)
        c = Client(url)
        c.request("POST", "/v1/datasets/imgs/warmup")
        while c.json("GET", "/v1/datasets/imgs/warmup").get("running", True):
            time.sleep(0.1)
        for path in Files(data, None).paths:  # (a) reads from the page cache, like (b) from memory
            with open(path, "rb") as f:
                f.read()

        runs = []
        for r in range(a.runs):
            if r:  # each run fills a fresh cache
                c.request("DELETE", f"/v1/datasets/{derived_name('imgs', STAGE)}")
            runs.append(measure(url, data, a, proc.pid))
            print(row_text(r + 1, runs[-1]), file=sys.stderr)
        out = {"items": a.items, "jpeg_kib": avg / 1024, "workers": a.workers, "batch": a.batch, "runs": runs}
        if a.json:
            print(json.dumps(out, indent=2))
        else:
            print(markdown(out, argv))
        if a.doc:
            write_section(a.doc, markdown(out, argv))
        return 0
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=15)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
