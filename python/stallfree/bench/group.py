"""``python -m stallfree.bench --group J[,J...]``: where the CPU of a
hyper-parameter search's J jobs goes, with and without coordinated prep
(docs/api.md "Coordinated prep", issue 49).

J jobs read one dataset of JPEGs (500x375 by default). The prep is split
as a real pipeline splits it: F, the deterministic stage, decodes a JPEG
into a uint8 HxWx3 array (what such a pipeline hands over: ~550 KiB an
image); A, the augmentation, is a random 224x224 crop and a random flip,
seeded per sample by (seed, epoch, index) and batched (numpy slicing: it
stands in for ``stallfree.torch.augment`` on an accelerator, which costs
the CPU next to nothing). Each job is its own process, without worker
processes, timed from a common start signal. Rows:

  independent  each job reads its own shuffled batches from the node (one
               batch request each) and runs F and A itself: J·N F calls
               an epoch;
  staging      ``CoordinatedLoader(transform=F, augment=A)``: each batch's
               producer runs F and stages the decoded batch; the other
               jobs map it (the node's shared-memory copy) and every job
               runs A itself;
  hand-off     staging's exchange alone: the producer stages a pre-made
               batch of decoded images (encoded each time, no read, no F)
               and the others map it; nobody augments;
  prep-fill    ``CoordinatedLoader(cache_stage=(S, F), augment=A)`` on an
               empty prep cache: its first epoch stages F's outputs and
               writes them to the cache (F once per item);
  prep-cache   the same on the full cache (a new group, the same stage):
               every job reads its batches from the cache and runs A;
               nothing is staged.

Per row: transform (F) calls per epoch, aggregate samples/s (J·N·epochs
over the slowest job's time), CPU ms per consumed sample: every job's
user+system time plus the node's (its idle CPU, measured for a second
before each row, taken off), over J·N·epochs; and its ratio to the
independent row. Goals (issue 49): staging and prep-cache at most 0.35x an
independent job's CPU per consumed sample at J=4, 0.25x at J=8.

Options: --items N (256) --batch B (16) --epochs E (2) --width W (500)
--height H (375) --crop C (224) --window W (16) --url URL (an existing
node; default: start bin/cachenode in a temporary directory) --quiet-wait S
(before each row's jobs start, wait up to S seconds for the 1-minute load to
fall below --quiet-load, 2) --group-timeout D (the started node's) --json
(the results as one JSON object on stdout; the table goes to stderr).
"""

import argparse
import io
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from .common import calls_in, count_call, cpu_model, free_port, log, memory_note, own_cpu, proc_cpu

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
ROWS = ("independent", "staging", "hand-off", "prep-fill", "prep-cache")
SEED = 3


# -- the prep: F (deterministic) and A (seeded per sample) --------------------------

class _Spent:
    """The CPU time and minor page faults of the calls of a transform, in
    the threads that made them (where the CPU of a row goes: F in a
    producer's threads on fresh memory, A on a mapped batch)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.reset()

    def reset(self):
        with self.lock:
            self.cpu, self.faults, self.count = 0.0, 0, 0

    @staticmethod
    def now():
        return time.thread_time(), resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF)).ru_minflt

    def add(self, start, count):
        cpu, faults = self.now()
        with self.lock:
            self.cpu += cpu - start[0]
            self.faults += faults - start[1]
            self.count += count


class Decode:
    """F: JPEG bytes -> HxWx3 uint8 array (Pillow). Each call appends a byte
    to ``counter``, so that calls are counted across processes."""

    def __init__(self, counter):
        self.counter = counter
        self.spent = _Spent()

    def __call__(self, data):
        from PIL import Image

        start = self.spent.now()
        count_call(self.counter)
        out = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
        self.spent.add(start, 1)
        return out


class CropFlip:
    """A: a random ``size`` x ``size`` crop and a random horizontal flip of
    each sample of a (B, H, W, C) batch, drawn from (seed, epoch, index)
    (``stallfree.seeded.uniform``, for the batch at once); returns a new
    (B, size, size, C) array."""

    def __init__(self, size):
        self.size = size
        self.spent = _Spent()

    def __call__(self, x, indices, epoch=0, seed=0):
        start = self.spent.now()
        out = self._crop_flip(x, indices, epoch, seed)
        self.spent.add(start, len(out))
        return out

    def _crop_flip(self, x, indices, epoch, seed):
        from ..seeded import uniform

        x = np.asarray(x)
        b, h, w = x.shape[:3]
        s = min(self.size, h, w)
        out = np.empty((b, s, s) + x.shape[3:], dtype=x.dtype)
        u = uniform(seed, epoch, indices, 0, 3)
        tops, lefts = (u[:, 0] * (h - s + 1)).astype(int), (u[:, 1] * (w - s + 1)).astype(int)
        pixel = np.dtype((np.void, x.dtype.itemsize * int(np.prod(x.shape[3:], dtype=np.int64))))
        for k in range(b):
            crop = x[k, tops[k]:tops[k] + s, lefts[k]:lefts[k] + s]
            if u[k, 2] < 0.5:  # mirrored: pixels copied whole, in reverse order
                np.copyto(out[k].view(pixel).reshape(s, s), crop.view(pixel).reshape(s, s)[:, ::-1])
            else:
                out[k] = crop
        return out


class Premade:
    """Stands in for a CoordinatedLoader's preparation in the hand-off row:
    the same pre-made batch of decoded images, written anew each time."""

    def __init__(self, batch):
        self.batch = batch
        self.alloc = None  # set by the loader, as on its own preparation: reused buffers

    def __call__(self, epoch, b, indices, encoded=True):
        from ..coordinated import encode_batch

        batch = self.batch[:len(indices)]
        return (encode_batch(batch, self.alloc) if encoded else batch), 0


def make_jpegs(root, n, width, height, seed=1):
    """n photo-like JPEGs of width x height (gradients, texture, noise; ~q90)."""
    from PIL import Image

    os.makedirs(root, exist_ok=True)
    yy, xx = np.mgrid[0:height, 0:width].astype(np.float32)
    for i in range(n):
        rng = np.random.default_rng(seed * 100_003 + i)
        base = np.stack([xx * 255 / width, yy * 255 / height, (xx + yy) * 255 / (width + height)], -1)
        base += 60 * np.sin(xx / (7 + i % 13) + yy / (11 + i % 7))[..., None]
        img = np.clip(base + rng.normal(0, 30, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(img).save(os.path.join(root, f"img{i:05d}.jpg"), "JPEG", quality=90)


# -- one job (a process of its own) ---------------------------------------------------

def run_job(a):
    from ..client import Client
    from ..coordinated import CoordinatedLoader, epoch_order

    f, aug = Decode(a.counter), CropFlip(a.crop)
    client = Client(a.url)
    n = client.dataset(a.dataset)["items"]
    premade = None
    if a.mode == "hand-off":
        # The batch's arrays: decoded images of the dataset's size, made
        # before the start (item 0 decoded, repeated).
        premade = Premade(np.stack([Decode(os.devnull)(client.batch(a.dataset, [0])[0][1])] * a.batch))
    print("ready", flush=True)
    sys.stdin.readline()  # the common start
    # The loader is made only now: a node older than c3bba9e (--url) starts
    # its group's detach clock when a loader is made, and the wait for the
    # start (the others starting up, the node's idle CPU measured for a
    # second) then detached the jobs under a short --group-timeout.
    loader = None
    if a.mode == "staging":
        loader = CoordinatedLoader(a.url, a.group_name, a.job, a.dataset, f, a.batch, 0, jobs=a.jobs, seed=SEED,
                                   window=a.window, augment=aug)
    elif a.mode == "hand-off":
        loader = CoordinatedLoader(a.url, a.group_name, a.job, a.dataset, None, a.batch, 0, jobs=a.jobs, seed=SEED,
                                   window=a.window)
        loader._prep = premade
    elif a.mode in ("prep-fill", "prep-cache"):
        loader = CoordinatedLoader(a.url, a.group_name, a.job, a.dataset, None, a.batch, 0, jobs=a.jobs, seed=SEED,
                                   window=a.window, cache_stage=(a.stage, f), augment=aug)
    f.spent.reset()
    aug.spent.reset()
    t0, c0, faults0 = time.monotonic(), own_cpu(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    samples, routes = 0, set()
    for epoch in range(a.epochs):
        if loader is None:  # independent: this job's own order, its own prep
            order = epoch_order(SEED * 1000 + a.job, epoch, n)
            for s in range(0, n, a.batch):
                idx = order[s:s + a.batch]
                x = np.stack([f(d) for _, d in client.batch(a.dataset, idx)])
                samples += len(aug(x, idx, epoch=epoch, seed=SEED))
            continue
        loader.set_epoch(epoch)
        for batch in loader:
            samples += len(batch)
        routes.add(loader.route)
    seconds, cpu = time.monotonic() - t0, own_cpu() - c0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
    if loader is not None:
        loader.close()
    print(json.dumps({"job": a.job, "seconds": seconds, "cpu": cpu, "samples": samples, "routes": sorted(routes),
                      "alone": bool(loader and loader.alone), "faults": faults,
                      "f": [f.spent.cpu, f.spent.faults, f.spent.count],
                      "a": [aug.spent.cpu, aug.spent.faults, aug.spent.count],
                      "w": [loader.handoff_cpu, 0, loader.handed_over] if loader else [0.0, 0, 0]}), flush=True)


# -- the driver ------------------------------------------------------------------------

def await_quiet(below, at_most, loadavg=os.getloadavg, sleep=time.sleep, clock=time.monotonic):
    """Waits until the 1-minute load average is below ``below``, for at most
    ``at_most`` seconds; returns the seconds waited. The load is an average:
    it has no event to wait for, so it is polled. After a row of J jobs it
    stays above 2 for a minute or more, and a row started then is no figure."""
    t0 = clock()
    while loadavg()[0] >= below and clock() - t0 < at_most:
        sleep(1.0)
    return clock() - t0


def run_row(a, mode, jobs, tmp, node_pid, stage, epochs):
    counter = os.path.join(tmp, f"{mode}-{jobs}.calls")
    group = f"bench-{mode}-{jobs}-{os.getpid()}-{int(time.time() * 1000)}"
    # Before the jobs start: a job that joined its group and then waits
    # longer than the node's --group-timeout for the start is detached, and
    # the row would measure jobs that each prepare every batch.
    waited = await_quiet(a.quiet_load, a.quiet_wait) if a.quiet_wait > 0 else 0.0
    procs = []
    for j in range(jobs):
        args = [sys.executable, "-m", "stallfree.bench.group", "--worker", "--mode", mode, "--url", a.url,
                "--dataset", a.dataset, "--counter", counter, "--job", str(j), "--jobs", str(jobs), "--batch",
                str(a.batch), "--epochs", str(epochs), "--window", str(a.window), "--group-name", group,
                "--stage", stage, "--crop", str(a.crop)]
        procs.append(subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      cwd=os.path.join(ROOT, "python")))
    try:
        for p in procs:
            if p.stdout.readline().strip() != "ready":
                raise RuntimeError(f"a {mode} job did not start")
        # The node's idle CPU (timers), taken off its figure below.
        i0, t0 = proc_cpu(node_pid), time.monotonic()
        time.sleep(1.0)
        idle = (proc_cpu(node_pid) - i0) / (time.monotonic() - t0)
        load = os.getloadavg()[0]
        n0, w0 = proc_cpu(node_pid), time.monotonic()
        for p in procs:
            p.stdin.write("go\n")
            p.stdin.flush()
        res = [json.loads(p.stdout.readline()) for p in procs]
        wall = time.monotonic() - w0
        node_cpu = max(proc_cpu(node_pid) - n0 - idle * wall, 0.0)
        for p in procs:
            p.wait(timeout=60)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    calls = calls_in(counter)
    samples = sum(r["samples"] for r in res)
    slowest = max(r["seconds"] for r in res)
    jobs_cpu = sum(r["cpu"] for r in res)
    return {"row": mode, "jobs": jobs, "epochs": epochs, "calls_per_epoch": calls / epochs, "samples": samples,
            "seconds": slowest, "samples_per_s": samples / slowest,
            "cpu_ms_per_sample": 1000 * (jobs_cpu + node_cpu) / samples,
            "jobs_cpu_ms_per_sample": 1000 * jobs_cpu / samples, "node_cpu_ms_per_sample": 1000 * node_cpu / samples,
            "node_idle_cpu_per_s": idle, "load_before": load, "waited_for_quiet_s": waited,
            # Where the jobs' CPU goes: F per call and A per sample, in the
            # threads that ran them, and the jobs' minor page faults.
            "f_ms_per_call": _per(res, "f", 0, 1000), "f_faults_per_call": _per(res, "f", 1, 1),
            "a_ms_per_sample": _per(res, "a", 0, 1000), "a_faults_per_sample": _per(res, "a", 1, 1),
            "handoff_write_ms_per_batch": _per(res, "w", 0, 1000),
            "jobs_faults_per_sample": sum(r["faults"] for r in res) / samples,
            "routes": sorted({x for r in res for x in r["routes"]}), "detached": sum(r["alone"] for r in res)}


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def _per(res, what, field, scale):
    """The jobs' total of res[what][field] per call (res[what][2]), scaled; None without calls."""
    calls = sum(r[what][2] for r in res)
    return scale * sum(r[what][field] for r in res) / calls if calls else None


def start_node(tmp, data, memory, group_timeout=""):
    binary = os.environ.get("STALLFREE_BIN", os.path.join(ROOT, "bin", "cachenode"))
    if not os.path.exists(binary):
        sys.exit(f"{binary} not found: run `make build` first, or pass --url")
    http = free_port()
    args = [binary, "--name", "bench", "--http", f"127.0.0.1:{http}", "--peer", f"127.0.0.1:{free_port()}",
            "--gossip", f"127.0.0.1:{free_port()}", "--raft", f"127.0.0.1:{free_port()}", "--data-dir",
            os.path.join(tmp, "node"), "--memory", memory, "--fast-timers", "--log-level", "warn",
            "--dataset", f"jpegs={data}"]
    if group_timeout:
        args += ["--group-timeout", group_timeout]
    log_file = open(os.path.join(tmp, "node.log"), "w")
    proc = subprocess.Popen(args, stdout=log_file, stderr=log_file)
    return proc, f"http://127.0.0.1:{http}"


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m stallfree.bench --group")
    ap.add_argument("--group", default="4,8", help="job counts J, comma-separated")
    ap.add_argument("--items", type=int, default=256)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--width", type=int, default=500)
    ap.add_argument("--height", type=int, default=375)
    ap.add_argument("--crop", type=int, default=224)
    ap.add_argument("--window", type=int, default=16)
    ap.add_argument("--memory", default="3GiB", help="the node's --memory")
    ap.add_argument("--url", default="")
    ap.add_argument("--dataset", default="jpegs")
    ap.add_argument("--rows", default=",".join(ROWS), help="rows to run, comma-separated")
    ap.add_argument("--quiet-wait", type=float, default=0.0,
                    help="before each row, wait up to this many seconds for the 1-minute load to fall "
                         "below --quiet-load")
    ap.add_argument("--quiet-load", type=float, default=2.0)
    ap.add_argument("--group-timeout", default="", help="the started node's --group-timeout (its default: 30s)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON on stdout")
    # a job process
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--counter", help=argparse.SUPPRESS)
    ap.add_argument("--job", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--jobs", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--group-name", help=argparse.SUPPRESS)
    ap.add_argument("--stage", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        return run_job(a)
    rows = [r for r in a.rows.split(",") if r]
    for r in rows:
        if r not in ROWS:
            sys.exit(f"--rows: unknown row {r!r} (rows: {', '.join(ROWS)})")
    try:
        job_counts = [int(x) for x in str(a.group).split(",") if x]
    except ValueError:
        job_counts = []
    if not job_counts or min(job_counts) < 1:
        sys.exit(f"--group {a.group!r}: job counts J >= 1, comma-separated (e.g. 4,8)")

    sys.path.insert(0, os.path.join(ROOT, "python"))
    from ..client import Client

    tmp = tempfile.mkdtemp(prefix="stallfree-bench-group")
    node = None
    try:
        data = os.path.join(tmp, "jpegs")
        make_jpegs(data, a.items, a.width, a.height)
        if a.url:
            Client(a.url).json("PUT", f"/v1/datasets/{a.dataset}", {"source": data})
            node_pid = None  # not ours: its CPU is not counted
        else:
            node, a.url = start_node(tmp, data, a.memory, a.group_timeout)
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
        for s in range(0, a.items, 64):  # every item in the node's memory before any row
            c.batch(a.dataset, list(range(s, min(s + 64, a.items))))
        size = sum(os.path.getsize(os.path.join(data, f)) for f in os.listdir(data)) / a.items
        machine = ", ".join(filter(None, [cpu_model(), f"{os.cpu_count()} CPUs", memory_note()]))
        head = (f"coordinated prep bench: {a.items} JPEGs of {a.width}x{a.height} ({size / 1024:.0f} KiB avg; decoded "
                f"{a.width * a.height * 3 / 1024:.0f} KiB), batch {a.batch}, {a.epochs} epoch(s) a row (prep-fill: 1), "
                f"no worker processes, window {a.window}, crop {a.crop}; {machine}; "
                f"load before: {os.getloadavg()[0]:.2f}")
        log(head)
        out = {"machine": machine, "items": a.items, "width": a.width,
               "height": a.height, "batch": a.batch, "epochs": a.epochs, "window": a.window, "results": []}
        for jobs in job_counts:
            stage = f"bench-{jobs}-{os.getpid()}"
            got = {}
            for row in rows:
                if row == "prep-cache" and "prep-fill" not in got:
                    got["prep-fill"] = run_row(a, "prep-fill", jobs, tmp, node_pid, stage, 1)
                epochs = 1 if row == "prep-fill" else a.epochs
                if row not in got:
                    got[row] = run_row(a, row, jobs, tmp, node_pid, stage, epochs)
            base = got.get("independent")
            for row in [r for r in ROWS if r in got]:
                r = got[row]
                r["cpu_vs_independent"] = r["cpu_ms_per_sample"] / base["cpu_ms_per_sample"] if base else None
                r["samples_per_s_vs_independent"] = r["samples_per_s"] / base["samples_per_s"] if base else None
                out["results"].append(r)
                ratio = f"{r['cpu_vs_independent']:.2f}x" if base else "-"
                log(f"J={jobs:<2} {row:<12} F calls/epoch {r['calls_per_epoch']:6.0f} ({r['calls_per_epoch'] / a.items:.2f} N)"
                    f"  aggregate {r['samples_per_s']:8.1f} samples/s  CPU {r['cpu_ms_per_sample']:6.3f} ms/sample "
                    f"(jobs {r['jobs_cpu_ms_per_sample']:.3f}, node {r['node_cpu_ms_per_sample']:.3f}) = {ratio} "
                    f"independent  [{r['seconds']:.1f} s, load {r['load_before']:.2f} after {r['waited_for_quiet_s']:.0f} s, routes {','.join(r['routes']) or '-'}]")
                log(f"J={jobs:<2} {row:<12}   where: F {_fmt(r['f_ms_per_call'], '.3f')} ms/call, "
                    f"{_fmt(r['f_faults_per_call'], '.1f')} faults/call; A {_fmt(r['a_ms_per_sample'], '.3f')} ms/sample, "
                    f"{_fmt(r['a_faults_per_sample'], '.1f')} faults/sample; "
                    f"hand-off write {_fmt(r['handoff_write_ms_per_batch'], '.2f')} ms/batch; "
                    f"jobs' minor faults {r['jobs_faults_per_sample']:.1f}/sample")
            goal = {4: 0.35, 8: 0.25}.get(jobs)
            if base and goal:
                for row in ("staging", "prep-cache"):
                    if row in got:
                        v = got[row]["cpu_vs_independent"]
                        log(f"J={jobs:<2} goal: {row} CPU per consumed sample <= {goal:.2f}x independent: {v:.2f}x, "
                            f"{'met' if v <= goal else 'NOT met'}")
        log(f"load after: {os.getloadavg()[0]:.2f}")
        if a.json:
            print(json.dumps(out))
    finally:
        if node is not None:
            node.terminate()
            node.wait(timeout=15)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
