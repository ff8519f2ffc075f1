"""``python -m stallfree.bench --train``: a real training loop over photo-like
JPEGs, five ways, each measured per epoch.

Rows (each with ``labels`` from the class folders):

  files        a plain map-style Dataset over the files in a DataLoader
               (workers): PIL decode + RandomResizedCrop + flip + normalize
               per sample;
  cached       ``CachedDataset`` with the same transform, whole minibatches
               per worker request;
  batchloader  ``BatchLoader(workers=...)`` over the same: threads wait for
               worker processes that fetch, transform and collate;
  prep         ``CachedDataset(cache_stage=...)``: ``stallfree.prep.DecodeResize`` (shorter
               side to crop*8/7, center square) once per item, then
               RandomResizedCrop + flip + normalize per sample in the workers;
  device-prep  ``DeviceLoader`` over a prep cache of its own (the same F,
               another stage name: its first epoch fills it, as a
               DeviceLoader user's does), ``stallfree.torch.augment`` on the
               device;
  device-jpeg  ``DeviceLoader(decode="jpeg")``: raw JPEGs decoded by
               torchvision (on the GPU with CUDA), augmented on the device.

The step is torchvision's ResNet-18 (``--model small``: a small CNN, for CPU
runs; bf16 autocast on CUDA) trained with SGD, or with ``--step sleep`` a fixed sleep per
batch standing in for an accelerator (the default without CUDA: say which in
any figure you quote). The model-alone rate is the step on a resident batch.
Per epoch: samples/s, stall = 1 - (model time for the epoch's batches) /
(epoch time), and CPU seconds per 1k samples of every process: the training
process (less the model's own CPU when the model runs on the CPU), the
DataLoader workers, and the cache node. Rows with a prep stage count F's
calls per epoch, and the epochs that filled the cache (F on each sample) are
compared with the files row's first epoch in CPU per sample.
"""

import argparse
import io
import json
import multiprocessing
import os
import platform
import resource
import shutil
import sys
import tempfile
import time
import traceback

import numpy as np

from ..client import Client
from ..prep import DecodeResize
from .common import calls_in, count_call
from .loader import cpu_model, log, memory_note, proc_cpu
from .prep import start_node

ROWS = ("files", "cached", "batchloader", "prep", "device-prep", "device-jpeg")
# On request only: device-prep-main, the copy and augmentation queued on the
# step's stream from the loop's thread (DeviceLoader's path before its side
# streams); device-prep-raw, the prep cache's uint8 batches delivered without
# augmentation (what delivery alone takes from the loop's thread; with the
# model, which cannot take uint8 HWC batches, the step trains on a resident
# batch, as alone, on each batch delivered).
EXTRA_ROWS = ("device-prep-main", "device-prep-raw")
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


# -- data -------------------------------------------------------------------------

def _jpeg(args):
    """One photo-like JPEG (smooth gradients, texture, sensor noise)."""
    path, i, w, h, quality = args
    from PIL import Image

    rng = np.random.default_rng(i)
    y, x = np.mgrid[0:h, 0:w].astype(np.float32)
    base = np.stack([x * 255 / w, y * 255 / h, (x + y) * 255 / (w + h)], -1)
    base += 60 * np.sin(x / (7 + i % 13) + y / (11 + i % 7))[..., None]
    img = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
    Image.fromarray(img).save(path, "JPEG", quality=quality)
    return os.path.getsize(path)


def make_jpegs(root, n, width, height, classes=10, quality=90):
    """n JPEGs in ``root/classNN/``, made by every core; their mean size."""
    jobs = []
    for i in range(n):
        d = os.path.join(root, f"class{i % classes:02d}")
        os.makedirs(d, exist_ok=True)
        jobs.append((os.path.join(d, f"img_{i:06d}.jpg"), i, width, height, quality))
    with multiprocessing.Pool(os.cpu_count()) as pool:
        sizes = pool.map(_jpeg, jobs, chunksize=8)
    return sum(sizes) / max(n, 1)


# -- per-sample transforms (the DataLoader rows) ------------------------------------

class Augment:
    """torchvision's per-sample RandomResizedCrop + flip + normalize, the same
    PIL pipeline on a JPEG (decoded here) and on an HWC array (the prep
    cache's, already decoded): the rows differ only in what they start from."""

    def __init__(self, crop):
        from torchvision import transforms as T

        self.pil = T.Compose([T.RandomResizedCrop(crop), T.RandomHorizontalFlip(), T.ToTensor(),
                              T.Normalize(MEAN, STD)])

    def __call__(self, item):
        from PIL import Image

        if isinstance(item, np.ndarray):
            return self.pil(Image.fromarray(item))
        return self.pil(Image.open(io.BytesIO(item)).convert("RGB"))


class Counted:
    """A prep stage's F, its calls counted (``count_call``): the prep row's F
    runs in DataLoader workers. Picklable, as F must be."""

    def __init__(self, fn, path):
        self.fn, self.path = fn, path

    def __call__(self, raw):
        count_call(self.path)
        return self.fn(raw)


def prep_side(a):
    """The prep stage's square side: the crop's, as Resize(256) is to 224."""
    return a.crop * 8 // 7


def prep_stage(a, row):
    """The prep stage (name, F) a row reads through and the file counting
    F's calls, or (None, None) for a row without one. The device rows keep
    a stage of their own: device-prep's first epoch then fills the cache
    on its own path, as a DeviceLoader user's first epoch does, not reading
    what the prep row filled."""
    if row not in ("prep", "device-prep", "device-prep-main", "device-prep-raw"):
        return None, None
    side = prep_side(a)
    name = f"rgb-{side}-v1" + ("-device" if row.startswith("device-") else "")
    counter = os.path.join(a.tmp, name + ".calls")
    return (name, Counted(DecodeResize(side), counter)), counter


class Files:
    """The ImageFolder way: (decoded + augmented sample, class)."""

    def __init__(self, root, transform):
        self.paths = sorted(os.path.join(dp, f) for dp, _, fs in os.walk(root) for f in fs)
        classes = sorted({os.path.basename(os.path.dirname(p)) for p in self.paths})
        self.labels = [classes.index(os.path.basename(os.path.dirname(p))) for p in self.paths]
        self.transform = transform

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as f:
            return self.transform(f.read()), self.labels[i]


# -- the step ------------------------------------------------------------------------

class SmallCNN:
    @staticmethod
    def make(classes):
        import torch.nn as nn

        return nn.Sequential(nn.Conv2d(3, 32, 3, 2, 1), nn.ReLU(), nn.Conv2d(32, 64, 3, 2, 1), nn.ReLU(),
                             nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, classes))


class Step:
    """One training step on (x, y): the model, a fixed sleep, or
    ``launches``: a fixed number of tiny torch ops (calibrated to take
    ``sleep_ms`` alone), each a Python call that lets go of the GIL inside,
    as a step's kernel launches are when the GPU is fast enough that the
    loop's thread never waits (ResNet-18 on an H200). What the loader's
    threads hold of the GIL makes that step longer, where a sleep hides it."""

    def __init__(self, kind, device, classes, sleep_ms, model_name):
        import torch

        self.kind, self.device, self.sleep = kind, device, sleep_ms / 1000
        self.cuda = device.type == "cuda"
        self.model_name = None
        if kind == "launches":
            self.ops = _TinyOps(sleep_ms / 1000)
        if kind == "model":
            import torchvision

            self.model_name = "resnet18" if model_name == "resnet18" else "small-cnn"
            net = torchvision.models.resnet18(num_classes=classes) if model_name == "resnet18" else SmallCNN.make(classes)
            self.net = net.to(device).to(memory_format=torch.channels_last)
            self.opt = torch.optim.SGD(self.net.parameters(), lr=0.01, momentum=0.9)
            self.loss = torch.nn.CrossEntropyLoss()

    def __call__(self, x, y):
        import torch

        if self.kind == "sleep":
            time.sleep(self.sleep)
            return
        if self.kind == "launches":
            self.ops()
            return
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cuda):
            loss = self.loss(self.net(x), y)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()

    def sync(self):
        if self.cuda:
            import torch

            torch.cuda.synchronize()

    def alone(self, batch, crop, classes, steps=None, make_x=None):
        """(seconds per batch, CPU seconds per batch) of the step on a
        resident batch (30 steps on CUDA, where one takes ~25 ms; 10
        elsewhere); with make_x(step), the step on what it returns."""
        import torch

        steps = steps or (30 if self.cuda else 10)

        x = torch.randn(batch, 3, crop, crop, device=self.device).contiguous(memory_format=torch.channels_last)
        y = torch.randint(0, classes, (batch,), device=self.device)
        make_x = make_x or (lambda i: x)
        for i in range(3):
            self(make_x(i), y)
        self.sync()
        t0, c0 = time.perf_counter(), _self_cpu()
        for i in range(steps):
            self(make_x(i), y)
        self.sync()
        return (time.perf_counter() - t0) / steps, (_self_cpu() - c0) / steps


class _TinyOps:
    """As many 8-element torch adds as take ``seconds`` on this thread
    alone (calibrated on the best of five tries of 2,000, against a busy
    moment)."""

    def __init__(self, seconds):
        import torch

        self.a, self.b, self.c = torch.ones(8), torch.ones(8), torch.empty(8)
        self.n, best = 2000, float("inf")
        for _ in range(5):
            t0 = time.perf_counter()
            self()
            best = min(best, time.perf_counter() - t0)
        self.n = max(1, int(seconds / best * 2000))

    def __call__(self):
        import torch

        a, b, c = self.a, self.b, self.c
        for _ in range(self.n):
            torch.add(a, b, out=c)


def _self_cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _children_cpu():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _faults():
    """Minor page faults of (this process, its waited-for children): fresh
    memory a row touches costs CPU in the kernel, the more on a VM."""
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt,
            resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt)


# -- the rows ------------------------------------------------------------------------

def loader_for(row, a, url, data, device):
    import torch
    import torch.utils.data as tud

    from ..torch import BatchLoader, CachedDataset, DeviceLoader

    stage, _ = prep_stage(a, row)
    pin = device.type == "cuda"
    if row == "batchloader":
        ds = CachedDataset(url, "imgs", transform=Augment(a.crop), labels="folder")
        return BatchLoader(ds, a.batch, shuffle=True, drop_last=True, threads=a.threads, workers=a.workers)
    if row in ("files", "cached", "prep"):
        if row == "files":
            ds = Files(data, Augment(a.crop))
            return tud.DataLoader(ds, batch_size=a.batch, shuffle=True, num_workers=a.workers, pin_memory=pin,
                                  drop_last=True)
        ds = CachedDataset(url, "imgs", transform=Augment(a.crop), labels="folder",
                           cache_stage=stage if row == "prep" else None)
        batches = tud.BatchSampler(tud.RandomSampler(ds), a.batch, drop_last=True)  # __getitems__ on torch < 2
        return tud.DataLoader(ds, sampler=batches, batch_size=None, num_workers=a.workers, pin_memory=pin,
                              collate_fn=tud.default_collate)
    aug = device_augment(a, device)
    if row in ("device-prep", "device-prep-main", "device-prep-raw"):
        ds = CachedDataset(url, "imgs", cache_stage=stage)
        dl = DeviceLoader(ds, a.batch, device=device, augment=None if row == "device-prep-raw" else aug,
                          labels="folder", shuffle=True, drop_last=True, threads=a.threads)
        dl._side_streams = row == "device-prep"  # -main: copy and augment on the step's stream, as before
        return dl
    return DeviceLoader(CachedDataset(url, "imgs"), a.batch, device=device, augment=aug, labels="folder",
                        decode="jpeg", shuffle=True, drop_last=True, threads=a.threads)


def device_augment(a, device):
    import torch

    from ..torch import augment as A

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    return A.Compose([A.RandomResizedCrop(a.crop), A.RandomHorizontalFlip(), A.Normalize(MEAN, STD)], dtype=dtype)


def run_row(row, a, url, data, device, step, node_pid, model_s, model_cpu):
    import torch

    loader = loader_for(row, a, url, data, device)
    counter = prep_stage(a, row)[1]
    resident = None
    if row == "device-prep-raw" and step.kind == "model":
        resident = torch.randn(a.batch, 3, a.crop, a.crop, device=device).contiguous(memory_format=torch.channels_last)
    epochs = []
    for e in range(a.epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(e)
        t0, s0, c0, n0, f0 = time.perf_counter(), _self_cpu(), _children_cpu(), proc_cpu(node_pid), _faults()
        calls0 = calls_in(counter) if counter else 0
        samples = batches = 0
        it = iter(loader)
        for x, y in it:
            x = x.to(device, non_blocking=True)
            if not x.is_floating_point():
                # device-prep-raw's uint8 (B, H, W, C) batch is no image for
                # a model: it trains on a resident batch, as alone, so the
                # stall is what delivery alone costs the loop.
                x = resident if resident is not None else x
            else:
                x = x.contiguous(memory_format=torch.channels_last)
            step(x, y.to(device, non_blocking=True))
            samples += len(y)
            batches += 1
        step.sync()
        del it  # DataLoader workers exit: their CPU lands in RUSAGE_CHILDREN
        wall = time.perf_counter() - t0
        own, workers, node = _self_cpu() - s0, _children_cpu() - c0, proc_cpu(node_pid) - n0
        faults = [b - a for a, b in zip(f0, _faults())]
        model_t = batches * model_s
        # The model's own CPU is not the loader's: on the CPU its compute, on
        # CUDA its launches (and the spinning while the launch queue is full),
        # as much per batch as the model alone took.
        loader_cpu = max(own - batches * model_cpu, 0.0)
        k = 1000 / max(samples, 1)
        epochs.append({"epoch": e + 1, "samples": samples, "seconds": wall, "samples_per_s": samples / wall,
                       "stall": max(0.0, 1 - model_t / wall),
                       "cpu_s_per_1k": {"loader": loader_cpu * k, "workers": workers * k, "node": node * k,
                                        "all": (loader_cpu + workers + node) * k,
                                        "training_process": own * k, "model": batches * model_cpu * k},
                       "faults_per_sample": {"training_process": faults[0] / max(samples, 1),
                                             "workers": faults[1] / max(samples, 1)},
                       # F's calls this epoch (None: a row without a prep
                       # stage): one a sample in the epoch that fills the
                       # cache (with drop_last, the items left out come later).
                       "prep_calls": calls_in(counter) - calls0 if counter else None})
        r = epochs[-1]
        log(f"  {row:12s} epoch {e + 1}: {r['samples_per_s']:8.1f} samples/s  stall {r['stall']:5.1%}  "
            f"CPU s/1k: loader {r['cpu_s_per_1k']['loader']:.2f} workers {r['cpu_s_per_1k']['workers']:.2f} "
            f"node {r['cpu_s_per_1k']['node']:.2f}  page faults/sample: loader "
            f"{r['faults_per_sample']['training_process']:.0f} workers {r['faults_per_sample']['workers']:.0f}")
    return epochs


def delivery(a, url, node_pid):
    """CPU ms per sample to deliver a prep-cached batch into the training
    process as one uint8 buffer, everything but the augmentation (the
    issue's goal: <= 0.1), over ``a.delivery_epochs`` epochs once the cache
    is full; and the same for the raw JPEGs device-jpeg decodes, up to the
    decode. The node's idle CPU (timers, gossip), measured for a second
    before, is taken off its figure."""
    from ..torch import CachedDataset, DeviceLoader

    side = prep_side(a)
    ds = CachedDataset(url, "imgs", cache_stage=prep_stage(a, "device-prep")[0])
    loader = DeviceLoader(ds, a.batch, device="cpu", labels="folder", shuffle=True, threads=a.threads)
    for _ in loader:  # fills any item the rows left unwritten
        pass
    n0, t0 = proc_cpu(node_pid), time.perf_counter()
    time.sleep(1.0)
    idle = (proc_cpu(node_pid) - n0) / (time.perf_counter() - t0)
    # /proc counts CPU in clock ticks (10 ms): each figure spans enough
    # epochs for a few thousand samples, so that a tick is a small part of it.
    passes = -(-4096 // max(len(ds), 1))
    # Two paths, alternating round by round: items copied from the node's
    # mapped memory (the default on the node's host), and the same loader
    # with the mapping off, reading every item through the socket.
    mapper = loader._mapper
    paths = [("mapped", loader, mapper), ("socket", loader, None)] if mapper is not None else [("socket", loader, None)]
    # And the raw JPEGs device-jpeg decodes, delivered as the decode's
    # input (the decode itself left out): what reading them costs the
    # training process.
    try:
        jpegs = DeviceLoader(CachedDataset(url, "imgs"), a.batch, device="cpu", decode="jpeg", labels="folder",
                             shuffle=True, threads=a.threads)
        jpegs._decode = lambda data: data
        for _ in jpegs:  # every item resident, and the buffers made
            pass
        paths.append(("jpeg", jpegs, jpegs.dataset._item_mapper()))
    except Exception as e:  # noqa: BLE001 - the other paths' figures still count
        _failure("delivery of raw JPEGs", e)
    out = []
    for e in range(a.delivery_epochs):
        for path, dl, m in paths:
            dl._mapper = m  # the jpeg path's DeviceLoader reads through its dataset's mapper, not this
            copied0 = m.copied if m is not None else 0
            t0, s0, n0 = time.perf_counter(), _self_cpu(), proc_cpu(node_pid)
            n = 0
            for p in range(passes):
                dl.set_epoch(1 + e * passes + p)
                for x, y in dl:
                    n += len(y)
                    del x
            wall = time.perf_counter() - t0
            own, node = _self_cpu() - s0, max(proc_cpu(node_pid) - n0 - idle * wall, 0.0)
            out.append({"path": path, "samples_per_s": n / wall, "loader_ms": own / n * 1e3, "node_ms": node / n * 1e3,
                        "all_ms": (own + node) / n * 1e3,
                        "item_bytes": side * side * 3 if path != "jpeg" else a.jpeg_bytes,
                        "copied_share": (m.copied - copied0) / n if m is not None else 0.0,
                        "node_idle_cpu_per_s": idle})
            log(f"  delivery round {e + 1} {path} ({n} samples): {n / wall:.0f} samples/s, CPU ms/sample loader "
                f"{own / n * 1e3:.3f} node {node / n * 1e3:.3f} all {(own + node) / n * 1e3:.3f}")
    return out


def first_epochs(rows):
    """CPU per sample, all processes, of each row's epoch that filled the
    prep cache (F on each of its samples) against the files row's first
    epoch: issue 48's goal for the prep cache's first epoch (<= 1.2x)."""
    files = rows.get("files")
    if not files:
        return {}
    base = files[0]["cpu_s_per_1k"]["all"]
    out = {}
    for row, epochs in rows.items():
        fill = next((e for e in epochs if (e.get("prep_calls") or 0) >= e["samples"] > 0), None)
        if fill is not None and base > 0:
            out[row] = fill["cpu_s_per_1k"]["all"] / base
    return out


def _failure(what, e):
    log(f"  {what}: FAILED: {e!r}\n{traceback.format_exc()}")
    return f"{type(e).__name__}: {e}"


def table(out):
    lines = [f"machine: {out['machine']}; device {out['device']}; step: {out['step']}; {out['items']} JPEGs "
             f"{out['size']} (~{out['jpeg_kib']:.0f} KiB), crop {out['crop']}, batch {out['batch']}, "
             f"{out['workers']} workers, {out['threads']} threads",
             f"model alone: {out['model_alone_samples_per_s']:.0f} samples/s"
             + (f"; with the device augmentation on resident batches: {out['model_and_augment_alone_samples_per_s']:.0f}"
                if out.get("model_and_augment_alone_samples_per_s") else ""), "",
             "| row | epoch | samples/s | stall | CPU s/1k loader | workers | node | all |",
             "|---|---|---|---|---|---|---|---|"]
    for row, epochs in out["rows"].items():
        for r in epochs:
            c = r["cpu_s_per_1k"]
            lines.append(f"| {row} | {r['epoch']} | {r['samples_per_s']:.0f} | {r['stall']:.0%} | {c['loader']:.2f} | "
                         f"{c['workers']:.2f} | {c['node']:.2f} | {c['all']:.2f} |")
    for what, why in out.get("failed", {}).items():
        lines.append(f"| {what} | FAILED: {why} | | | | | | |")
    first = out.get("first_epoch_vs_files") or {}
    if first:
        lines += ["", "the prep cache's first epoch (F on each sample), CPU per sample against files' epoch 1: "
                  + ", ".join(f"{row} {x:.2f}x" for row, x in first.items())
                  + ("; device-prep's includes its augmentation on the CPU" if out["device"] == "cpu"
                     and "device-prep" in first else "")]
    for path in ("mapped", "socket", "jpeg"):
        ds = sorted((d for d in out.get("delivery", []) if d.get("path", "socket") == path), key=lambda d: d["all_ms"])
        if not ds:
            continue
        d = ds[len(ds) // 2]
        what = (f"raw JPEGs as device-jpeg's decode input ({d['item_bytes'] // 1024} KiB on average, the decode left out)"
                if path == "jpeg" else f"a prep-cached batch, {path} ({d['item_bytes'] // 1024} KiB arrays, no augmentation)")
        lines += ["", f"delivery of {what}, "
                      f"median of {len(ds)} rounds of >= 4096 samples: {d['all_ms']:.3f} CPU ms/sample (loader {d['loader_ms']:.3f}, "
                      f"node {d['node_ms']:.3f}), {d['samples_per_s']:.0f} samples/s; best round "
                      f"{ds[0]['all_ms']:.3f}; share copied from the mapping {d.get('copied_share', 0):.2f}"]
    return "\n".join(lines)


def main(argv):
    p = argparse.ArgumentParser(prog="python -m stallfree.bench --train", description=__doc__.split("\n\n")[0])
    p.add_argument("--train", action="store_true")
    p.add_argument("--items", type=int, default=25600)
    p.add_argument("--width", type=int, default=500)
    p.add_argument("--height", type=int, default=375)
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 4),
                   help="worker processes of the DataLoader rows and of batchloader")
    p.add_argument("--threads", type=int, default=4, help="DeviceLoader threads")
    p.add_argument("--rows", default=",".join(ROWS), help="comma-separated, among " + ", ".join(ROWS + EXTRA_ROWS))
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--step", choices=("model", "sleep", "launches"), default=None,
                   help="the model, a fixed sleep per batch, or as long a run of tiny torch ops, each letting go of "
                        "the GIL as a kernel launch does (default: model on CUDA, sleep on the CPU)")
    p.add_argument("--sleep-ms", type=float, default=25.0,
                   help="the sleep (or the tiny ops' time alone) per batch with --step sleep (launches)")
    p.add_argument("--model", choices=("resnet18", "small"), default="resnet18")
    p.add_argument("--memory", default=None, help="the node's --memory (default: enough for the data twice)")
    p.add_argument("--delivery-epochs", type=int, default=5,
                   help="rounds (of >= 4096 samples each) of the delivery measurement (0: skip it)")
    p.add_argument("--json", action="store_true", help="results as JSON on stdout")
    a = p.parse_args(argv)
    rows = [r for r in a.rows.split(",") if r]
    if not rows or set(rows) - set(ROWS) - set(EXTRA_ROWS):
        p.error(f"--rows {a.rows!r}: among {', '.join(ROWS + EXTRA_ROWS)}")
    try:
        import PIL  # noqa: F401
        import torch
        import torchvision  # noqa: F401
    except ImportError as e:
        raise SystemExit(f"the training bench needs Pillow, torch and torchvision ({e})")
    device = torch.device(a.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    kind = a.step or ("model" if device.type == "cuda" else "sleep")
    tmp = tempfile.mkdtemp(prefix="stallfree-train-bench")
    a.tmp = tmp
    proc = None
    try:
        data = os.path.join(tmp, "jpegs")
        t0 = time.perf_counter()
        avg = make_jpegs(data, a.items, a.width, a.height)
        a.jpeg_bytes = int(avg)
        log(f"{a.items} JPEGs of {a.width}x{a.height}, {avg / 1024:.0f} KiB on average, made in "
            f"{time.perf_counter() - t0:.1f}s on {os.cpu_count()} cores")
        side = prep_side(a)
        # The raw items and two prep stages (prep's and the device rows'),
        # with room to spare.
        memory = a.memory or f"{max(256, int(a.items * (avg + 2 * side * side * 3) * 1.5) >> 20)}MiB"
        proc, url = start_node(tmp, data, memory)
        c = Client(url)
        c.request("POST", "/v1/datasets/imgs/warmup")  # the cached rows read memory, the files row the page cache
        while c.json("GET", "/v1/datasets/imgs/warmup").get("running", True):
            time.sleep(0.1)
        if device.type == "cuda":
            torch.backends.cudnn.benchmark = True  # fixed shapes: pick each convolution's fastest kernel once
        step = Step(kind, device, 10, a.sleep_ms, a.model)
        model_s, model_cpu = step.alone(a.batch, a.crop, 10)
        what = {"model": f"{step.model_name} on {device.type}", "sleep": f"sleep {a.sleep_ms:g} ms per batch",
                "launches": f"tiny torch ops standing for launches, {a.sleep_ms:g} ms per batch alone"}[kind]
        log(f"step: {what}; model alone {a.batch / model_s:.0f} samples/s, {model_cpu / a.batch * 1e3:.3f} CPU ms/sample")
        both = None
        if any(r in ("device-prep", "device-prep-main") for r in rows):
            # The step with the device rows' augmentation, on uint8 batches
            # already on the device: what device-prep would reach if
            # delivery cost the loop nothing.
            aug = device_augment(a, device)
            raw = torch.randint(0, 256, (a.batch, side, side, 3), dtype=torch.uint8, device=device)
            idx = np.arange(a.batch, dtype=np.int64)
            both, _ = step.alone(a.batch, a.crop, 10, make_x=lambda i: aug(raw, idx + i * a.batch, epoch=0))
            log(f"model + device augmentation alone {a.batch / both:.0f} samples/s")
        out = {"machine": ", ".join(filter(None, [cpu_model(), f"{os.cpu_count()} cores", platform.system(),
                                                  memory_note()])), "device": str(device),
               "step": what, "items": a.items, "size": f"{a.width}x{a.height}", "jpeg_kib": avg / 1024,
               "crop": a.crop, "batch": a.batch, "workers": a.workers, "threads": a.threads,
               "model_alone_samples_per_s": a.batch / model_s,
               "model_alone_cpu_ms_per_sample": model_cpu / a.batch * 1e3,
               "model_and_augment_alone_samples_per_s": a.batch / both if both else None, "rows": {}}
        for row in rows:
            # A row that fails is reported and the others still run: a run on
            # a lent GPU machine is one try, and one row's defect should not
            # cost the figures of the rest.
            try:
                out["rows"][row] = run_row(row, a, url, data, device, step, proc.pid, model_s, model_cpu)
            except Exception as e:  # noqa: BLE001 - reported below, and the exit status says so
                out.setdefault("failed", {})[row] = _failure(row, e)
        out["first_epoch_vs_files"] = first_epochs(out["rows"])
        if a.delivery_epochs > 0:
            try:
                out["delivery"] = delivery(a, url, proc.pid)
            except Exception as e:  # noqa: BLE001
                out.setdefault("failed", {})["delivery"] = _failure("delivery", e)
        print(json.dumps(out, indent=2) if a.json else table(out))
        return 1 if out.get("failed") else 0
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=15)
        shutil.rmtree(tmp, ignore_errors=True)
