"""``python -m stallfree.bench --micro``: the single-process measurements
BENCHMARKS.md quotes to explain the bigger benches, each timed alone:

- copying a file in /dev/shm into a buffer by ``mmap`` and by ``preadv``
  (with and without ``MAP_POPULATE``): the floor of a mapped checkpoint load;
- writing staged-batch-sized files into /dev/shm, removed at once or kept
  for a while: what a node's staging write costs;
- a coordinated producer's hand-off of a batch of decoded images into a new
  memfd: stacked into a reused buffer and then written, against written
  straight from the arrays (``writev``);
- a job's crops of a staged batch (16 decoded 500x375 images in a memfd)
  through a mapping made for the batch, the same with its page table
  filled first, and through one mapping kept: what a fresh mapping costs,
  which a VM whose page tables the hypervisor shadows makes dear;
- the training bench's per-image steps (the plain transform, the prep stage
  F, the augmentation on F's array, encoding and decoding it): where the prep
  cache's first epoch goes (needs Pillow and torchvision).

Prints one line per figure, or JSON with ``--json``.
"""

import argparse
import collections
import glob
import json
import mmap
import os
import shutil
import tempfile
import time

SHM = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()


def shm_copy(mb, rounds):
    """Seconds per GB to copy a file in SHM into a buffer, by mapping and by
    preadv (best of rounds)."""
    size = mb << 20
    fd, path = tempfile.mkstemp(dir=SHM, prefix="stallfree-micro-")
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as m:
            chunk = os.urandom(1 << 20)
            for off in range(0, size, len(chunk)):
                m[off:off + len(chunk)] = chunk
        buf = bytearray(size)
        mv = memoryview(buf)
        out = {}
        for name, flags in (("mmap", mmap.MAP_SHARED), ("mmap+populate", mmap.MAP_SHARED | mmap.MAP_POPULATE)):
            best = float("inf")
            for _ in range(rounds):
                t = time.perf_counter()
                with mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ) as m:
                    mv[:] = memoryview(m)
                best = min(best, time.perf_counter() - t)
            out[name] = best / (size / 1e9)
        best = float("inf")
        for _ in range(rounds):
            t, off = time.perf_counter(), 0
            while off < size:
                off += os.preadv(fd, [mv[off:off + (64 << 20)]], off)
            best = min(best, time.perf_counter() - t)
        out["preadv"] = best / (size / 1e9)
        return out
    finally:
        os.close(fd)
        os.remove(path)


def shm_writes(mib, n, kept):
    """CPU ms per file of writing n new files of mib MiB into SHM, each
    removed once `kept` newer ones exist."""
    data = os.urandom(mib << 20)
    live = collections.deque()
    t = time.process_time()
    try:
        for _ in range(n):
            fd, path = tempfile.mkstemp(dir=SHM, prefix="stallfree-micro-")
            os.write(fd, data)
            os.close(fd)
            live.append(path)
            while len(live) > kept:
                os.remove(live.popleft())
        return (time.process_time() - t) / n * 1e3
    finally:
        for p in live:
            os.remove(p)


def handoff_writes(rows, n):
    """CPU ms per batch of rows decoded 500x375 images handed over in a new
    memfd, n batches each way: {"stack_then_write", "writev"}."""
    import numpy as np

    from ..coordinated import _memfd_of, _pieces, _Stacked, encode_batch

    rng = np.random.default_rng(1)
    images = [rng.integers(0, 255, (375, 500, 3), dtype=np.uint8) for _ in range(rows)]
    buf = []

    def reused(size):  # as the loader's pool hands out: one buffer, reused
        if not buf or buf[0].nbytes < size:
            buf[:] = [np.empty(size, np.uint8)]
        return buf[0][:size]

    ways = {"stack_then_write": lambda: _memfd_of([encode_batch(_Stacked.of(images), reused)]),
            "writev": lambda: _memfd_of(_pieces(_Stacked.of(images)))}
    out = {}
    for name, way in ways.items():
        os.close(way())  # the buffer allocated, the code paths warm
        t = time.process_time()
        for _ in range(n):
            os.close(way())
        out[name] = (time.process_time() - t) / n * 1e3
    return out


def mapped_crops(n):
    """CPU µs per image of cropping 224x224 out of a staged batch of 16
    decoded 500x375 images held in a memfd, n batches each way:
    {"fresh_mapping", "fresh_mapping_populated", "kept_mapping"}, and the
    minor faults per image of each."""
    import resource

    import numpy as np

    from ..coordinated import _map_fd, _populate_read

    rows, h, w = 16, 375, 500
    size = rows * h * w * 3
    fd, kept = os.memfd_create("stallfree-micro", os.MFD_CLOEXEC), None
    try:
        os.write(fd, np.random.default_rng(1).integers(0, 255, size, dtype=np.uint8).tobytes())
        rng = np.random.default_rng(2)
        kept = _map_fd(fd)

        def crops(m):
            a = np.frombuffer(m, np.uint8, count=size).reshape(rows, h, w, 3)
            for r in range(rows):
                y, x = rng.integers(0, h - 224), rng.integers(0, w - 224)
                np.ascontiguousarray(a[r, y:y + 224, x:x + 224])

        def fresh(populate):
            m = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            if populate:
                _populate_read(m)
            crops(m)
            m.close()

        ways = {"fresh_mapping": lambda: fresh(False), "fresh_mapping_populated": lambda: fresh(True),
                "kept_mapping": lambda: crops(kept)}
        out = {}
        for name, way in ways.items():
            way()  # the code paths warm
            t, f = time.process_time(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
            for _ in range(n):
                way()
            out[name] = {"cpu_us": (time.process_time() - t) / (n * rows) * 1e6,
                         "faults": (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f) / (n * rows)}
        return out
    finally:
        if kept is not None:
            kept.close()
        os.close(fd)


def prep_steps(images, rounds):
    """CPU ms per image of the training bench's steps on its JPEGs."""
    import io

    import numpy as np
    from PIL import Image

    from ..prep import DecodeResize, decode, encode
    from .train import Augment, make_jpegs

    tmp = tempfile.mkdtemp(prefix="stallfree-micro-")
    try:
        make_jpegs(tmp, images, 500, 375)
        raws = [open(p, "rb").read() for p in sorted(glob.glob(os.path.join(tmp, "**", "*.jpg"), recursive=True))]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    aug, stage = Augment(224), DecodeResize(256)

    def resize_then_crop(raw, side=256):
        """Stage F written out naively: the whole image resized, then cropped."""
        im = Image.open(io.BytesIO(raw)).convert("RGB")
        w, h = im.size
        s = side / min(w, h)
        im = im.resize((max(side, round(w * s)), max(side, round(h * s))), Image.BILINEAR)
        left, top = (im.width - side) // 2, (im.height - side) // 2
        return np.asarray(im.crop((left, top, left + side, top + side)))

    def cpu(f, xs):
        t = time.process_time()
        out = [f(x) for x in xs]
        return (time.process_time() - t) / len(xs) * 1e3, out

    out = collections.defaultdict(list)
    for _ in range(rounds):
        out["plain_transform"].append(cpu(aug, raws)[0])
        out["decode_only"].append(cpu(lambda r: Image.open(io.BytesIO(r)).convert("RGB"), raws)[0])
        ms, arrays = cpu(stage, raws)
        out["stage_f"].append(ms)
        out["stage_f_resize_then_crop"].append(cpu(resize_then_crop, raws)[0])
        out["augment_on_array"].append(cpu(aug, arrays)[0])
        ms, encoded = cpu(encode, arrays)
        out["encode"].append(ms)
        out["decode_array"].append(cpu(decode, encoded)[0])
    return dict(out)


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m stallfree.bench --micro", description=__doc__.split("\n\n")[0])
    ap.add_argument("--micro", action="store_true")
    ap.add_argument("--copy-mb", type=int, default=1024)
    ap.add_argument("--write-mib", type=int, default=9)
    ap.add_argument("--writes", type=int, default=200)
    ap.add_argument("--handoffs", type=int, default=100, help="batches of 16 images handed over, each way")
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    out = {"shm_dir": SHM, "copy_s_per_gb": shm_copy(a.copy_mb, a.rounds),
           "write_cpu_ms_per_file": {f"kept_{k}": shm_writes(a.write_mib, a.writes, k) for k in (0, 30)},
           "write_mib": a.write_mib, "handoff_cpu_ms_per_batch16": handoff_writes(16, a.handoffs),
           "crop_of_staged_batch": mapped_crops(a.handoffs)}
    try:
        out["prep_cpu_ms_per_image"] = prep_steps(a.images, a.rounds)
    except ImportError as e:
        out["prep_cpu_ms_per_image"] = f"skipped: {e}"
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"copy {a.copy_mb} MiB out of {SHM}, s per GB (best of {a.rounds}): "
          + ", ".join(f"{k} {v:.3f}" for k, v in out["copy_s_per_gb"].items()))
    print(f"write {a.writes} files of {a.write_mib} MiB into {SHM}, CPU ms per file: "
          + ", ".join(f"{k} {v:.2f}" for k, v in out["write_cpu_ms_per_file"].items()))
    print(f"hand over a batch of 16 decoded 500x375 images in a new memfd ({a.handoffs} each way), CPU ms per batch: "
          + ", ".join(f"{k} {v:.2f}" for k, v in out["handoff_cpu_ms_per_batch16"].items()))
    print(f"crop 224x224 out of a staged batch of 16 500x375 images ({a.handoffs} batches each way), "
          "CPU µs and minor faults per image: "
          + ", ".join(f"{k} {v['cpu_us']:.1f} ({v['faults']:.1f})" for k, v in out["crop_of_staged_batch"].items()))
    steps = out["prep_cpu_ms_per_image"]
    if isinstance(steps, dict):
        print(f"training bench steps, CPU ms per image ({a.images} JPEGs of 500x375, each round): "
              + "; ".join(f"{k} " + " / ".join(f"{v:.2f}" for v in vs) for k, vs in steps.items()))
    else:
        print(f"training bench steps: {steps}")
    return 0
