"""``python -m stallfree.bench --split``: the memory split by sensitivity
(docs/api.md, Synergy) against an equal split, with two real jobs at once.

One cachenode with a throttled source (``--source-rate``) serves two
datasets, each larger than half its memory. Two training jobs run at the
same time in their own processes, through the Python stack (``Client``
batches fetched by a threaded read-ahead loader, wrapped in ``StallMeter``):
"io" computes nothing (every second of its epoch is waiting for data), "gpu"
holds each batch for a fixed step (a GPU computing: the CPU is free, so it
sleeps). First both datasets get an equal quota; after some epochs the node's
plan (``GET /v1/plan``) is applied (``POST /v1/plan/apply``) and the jobs run
again. Reported: each job's epoch under both splits, the plan's predicted
epoch against the measured one, and the goals (predicted within ±10%; io ≥
1.3x faster; gpu ≤ 5% slower).
"""

import argparse
import collections
import concurrent.futures
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time

from .common import free_port
from ..client import Client
from ..meter import StallMeter

MiB = 1 << 20
_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "kb": 1000, "mb": 1000 ** 2, "gb": 1000 ** 3}
# What the store charges per item beyond its payload (store.EntryOverhead
# plus alignment): the node plans in payload bytes net of it.
ITEM_OVERHEAD = 128 + 64


def parse_size(s):
    s = str(s).strip().lower().replace(" ", "")
    num = s.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = s[len(num):]
    if unit not in _UNITS or not num:
        raise ValueError(f"size {s!r}: want e.g. 64MiB, 512KiB or a number of bytes")
    return int(float(num) * _UNITS[unit])


def cachenode_binary():
    env = os.environ.get("STALLFREE_BIN")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.join(here, "..", "..", "..", "bin", "cachenode")
    if os.path.exists(built):
        return os.path.abspath(built)
    found = shutil.which("cachenode")
    if not found:
        raise SystemExit("cachenode not found: run `make build` or set STALLFREE_BIN")
    return found


class Node:
    """One real cachenode process on loopback ports."""

    def __init__(self, tmp, memory, source_rate, binary=None, extra=()):
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(os.path.join(tmp, "node.log"), "w")
        args = [binary or cachenode_binary(), "--name", "split1", "--http", self.url[len("http://"):],
                "--peer", f"127.0.0.1:{free_port()}", "--gossip", f"127.0.0.1:{free_port()}",
                "--raft", f"127.0.0.1:{free_port()}", "--data-dir", os.path.join(tmp, "node"),
                "--memory", str(memory), "--source-rate", str(source_rate), "--policy", "minio",
                "--fast-timers", "--log-level", "warn", "--bootstrap", *extra]
        try:
            self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log)
        except OSError:
            self.log.close()
            raise
        self.client = Client(self.url)
        deadline = time.time() + 60
        while True:
            if self.proc.poll() is not None:
                self.log.close()
                raise RuntimeError(f"cachenode exited with {self.proc.returncode}; see {self.log.name}")
            try:
                self.client.request("GET", "/readyz")
                return
            except Exception:  # noqa: BLE001 - not up yet
                if time.time() > deadline:
                    self.stop()
                    raise
                time.sleep(0.1)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def write_dataset(root, items, size, seed):
    rnd = random.Random(seed)
    os.makedirs(root, exist_ok=True)
    for i in range(items):
        with open(os.path.join(root, f"item_{i:06d}.bin"), "wb") as f:
            f.write(rnd.randbytes(size))


class Loader:
    """A threaded read-ahead loader (what ``BatchLoader`` does): each epoch
    a seeded permutation cut into batches, each batch one request, ``depth``
    batches fetched ahead by ``threads`` threads, yielded in order."""

    def __init__(self, client, dataset, items, batch_size, seed, threads=4, depth=8):
        self.client, self.dataset, self.items = client, dataset, items
        self.batch_size, self.seed, self.threads, self.depth = batch_size, seed, threads, depth

    def epoch(self, e):
        order = list(range(self.items))
        random.Random(self.seed * 100003 + e).shuffle(order)
        batches = [order[i:i + self.batch_size] for i in range(0, len(order), self.batch_size)]
        with concurrent.futures.ThreadPoolExecutor(self.threads) as ex:
            ahead = collections.deque()
            todo = iter(batches)
            for b in todo:
                ahead.append(ex.submit(self.client.batch, self.dataset, b))
                if len(ahead) >= self.depth:
                    break
            while ahead:
                got = ahead.popleft().result()
                nxt = next(todo, None)
                if nxt is not None:
                    ahead.append(ex.submit(self.client.batch, self.dataset, nxt))
                yield [data for _, data in got]


def run_job(argv):
    """One job's process: prints one JSON line per epoch."""
    ap = argparse.ArgumentParser(prog="stallfree.bench.split --job")
    ap.add_argument("--job", required=True)
    ap.add_argument("--url", required=True)
    ap.add_argument("--dataset", required=True)
    ap.add_argument("--items", type=int, required=True)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--step-ms", type=float, default=0.0)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--first-epoch", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    client = Client(a.url)
    loader = Loader(client, a.dataset, a.items, a.batch_size, a.seed)
    for e in range(a.first_epoch, a.first_epoch + a.epochs):
        meter = StallMeter(client, loader.epoch(e), job=a.job, rank=0, dataset=a.dataset, report_every=10)
        t0 = time.perf_counter()
        n = 0
        for batch in meter:
            if a.step_ms:
                time.sleep(a.step_ms / 1000)  # the GPU's step: the CPU waits
            n += sum(len(b) for b in batch)
        wall = time.perf_counter() - t0
        print(json.dumps({"job": a.job, "epoch": e, "wall_s": wall, "bytes": n, **meter.last_epoch}), flush=True)
    return 0


def phase(node, jobs, epochs, first_epoch):
    """Runs every job for epochs at once; returns {job: [epoch dicts]}."""
    procs = {}
    for j in jobs:
        args = [sys.executable, "-m", "stallfree.bench.split", "--job", j["name"], "--url", node.url,
                "--dataset", j["dataset"], "--items", str(j["items"]), "--batch-size", str(j["batch_size"]),
                "--step-ms", str(j["step_ms"]), "--epochs", str(epochs), "--first-epoch", str(first_epoch),
                "--seed", str(j["seed"])]
        env = dict(os.environ)
        pkg = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env["PYTHONPATH"] = pkg + os.pathsep + env.get("PYTHONPATH", "")
        procs[j["name"]] = subprocess.Popen(args, stdout=subprocess.PIPE, env=env, text=True)
    out = {}
    for name, p in procs.items():
        stdout, _ = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(f"job {name} failed with exit code {p.returncode}")
        out[name] = [json.loads(line) for line in stdout.splitlines() if line.strip()]
    return out


def mean(xs):
    return sum(xs) / len(xs) if xs else float("nan")


def run(memory=96 * MiB, item_size=64 << 10, fraction=0.75, source_rate=8 * MiB, compute_s=6.0,
        batch_size=16, epochs_equal=3, epochs_plan=3, tmp=None, log=print):
    """Runs the comparison; returns a dict of figures (see main)."""
    own_tmp = tmp is None
    tmp = tmp or tempfile.mkdtemp(prefix="sf-split-")
    items = int(memory * fraction) // item_size
    for name, seed in (("io", 1), ("gpu", 2)):
        write_dataset(os.path.join(tmp, name), items, item_size, seed)
    batches = -(-items // batch_size)
    jobs = [{"name": "io", "dataset": "ds-io", "items": items, "batch_size": batch_size, "step_ms": 0.0, "seed": 11},
            {"name": "gpu", "dataset": "ds-gpu", "items": items, "batch_size": batch_size,
             "step_ms": 1000.0 * compute_s / batches, "seed": 12}]
    node = Node(tmp, memory, source_rate)
    try:
        c = node.client
        usable = memory * item_size // (item_size + ITEM_OVERHEAD)
        equal = usable // 2
        for j in jobs:
            c.json("PUT", f"/v1/datasets/{j['dataset']}",
                   {"source": os.path.join(tmp, j["name"]), "quota": equal})
        log(f"split bench: 2 datasets of {items} x {item_size // 1024} KiB ({items * item_size / MiB:.0f} MiB) each, "
            f"memory {memory / MiB:.0f} MiB, storage {source_rate / MiB:.1f} MiB/s per dataset, "
            f"gpu computes {compute_s:.1f} s per epoch; equal quota {equal / MiB:.1f} MiB each")
        t0 = time.time()
        eq = phase(node, jobs, epochs_equal, 0)
        plan = c.plan()
        applied = c.apply_plan()
        pl = phase(node, jobs, epochs_plan, epochs_equal)
        after = c.plan()
        elapsed = time.time() - t0
    finally:
        node.stop()
        if own_tmp:
            shutil.rmtree(tmp, ignore_errors=True)

    res = {"memory": memory, "items": items, "item_size": item_size, "source_rate": source_rate,
           "compute_s": compute_s, "equal_quota": equal, "elapsed_s": elapsed,
           "plan_before": plan, "applied": applied, "plan_after": after, "jobs": {}}
    rows = {r["job"]: r for r in applied["jobs"]}
    for j in jobs:
        name = j["name"]
        # The first epoch of each phase is a transition (a cold cache; a
        # cache growing to its new quota): steady epochs are the rest.
        m_eq = mean([e["seconds"] for e in eq[name][1:]])
        m_pl = mean([e["seconds"] for e in pl[name][1:]])
        pred = rows[name]["epoch_s_predicted"] if name in rows else float("nan")
        # The epoch's parts: what the split changes is the wait; the step
        # (a sleep standing for the GPU) stretches only when a loaded
        # machine wakes the job late.
        parts = {f"{part}_{ph}_s": mean([e[part + "_s"] for e in eps[name][1:]])
                 for part in ("wait", "step") for ph, eps in (("equal", eq), ("plan", pl))}
        res["jobs"][name] = {"equal_s": m_eq, "plan_s": m_pl, "predicted_s": pred, **parts,
                             "prediction_error": pred / m_pl - 1, "speedup": m_eq / m_pl,
                             "quota_equal": equal, "quota_plan": applied["split"].get(j["dataset"]),
                             "epochs_equal": eq[name], "epochs_plan": pl[name]}
    io, gpu = res["jobs"]["io"], res["jobs"]["gpu"]
    res["goals"] = {
        "prediction_within_10pct": all(abs(x["prediction_error"]) <= 0.10 for x in (io, gpu)),
        "io_speedup_ge_1.3": io["speedup"] >= 1.3,
        "gpu_slowdown_le_5pct": gpu["plan_s"] <= 1.05 * gpu["equal_s"],
    }
    return res


def main(argv):
    if "--job" in argv:
        return run_job(argv)
    ap = argparse.ArgumentParser(prog="python -m stallfree.bench --split", description=__doc__.split("\n\n")[0])
    ap.add_argument("--split", action="store_true")
    ap.add_argument("--memory", default="96MiB", help="the node's --memory")
    ap.add_argument("--item-size", default="64KiB")
    ap.add_argument("--fraction", type=float, default=0.75, help="each dataset's size as a fraction of the memory (> 0.5)")
    ap.add_argument("--source-rate", default="8MiB", help="the node's --source-rate (bytes/s per dataset)")
    ap.add_argument("--compute", type=float, default=6.0, help="the gpu job's compute seconds per epoch")
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=3, help="epochs under each split (the first of each is a transition)")
    ap.add_argument("--json", help="write every figure (epochs, plans) to this file")
    ap.add_argument("--record", help="write the summary BENCHMARKS.md shows to this file (docs/bench/split.json; "
                                     "then `bin/sfbench -report` renders it)")
    a = ap.parse_args(argv)
    if not 0.5 < a.fraction <= 1 or a.epochs < 2:
        ap.error("--fraction must be in (0.5, 1] and --epochs at least 2")
    log = lambda s: print(s, flush=True)  # noqa: E731
    load0, date = os.getloadavg()[0], time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    res = run(memory=parse_size(a.memory), item_size=parse_size(a.item_size), fraction=a.fraction,
              source_rate=parse_size(a.source_rate), compute_s=a.compute, batch_size=a.batch_size,
              epochs_equal=a.epochs, epochs_plan=a.epochs, log=log)
    log(f"{'job':<5} {'equal split':>12} {'plan':>8} {'predicted':>10} {'error':>7} {'speedup':>8} {'quota equal → plan':>22}")
    for name, j in res["jobs"].items():
        log(f"{name:<5} {j['equal_s']:>11.2f}s {j['plan_s']:>7.2f}s {j['predicted_s']:>9.2f}s {100 * j['prediction_error']:>6.1f}% "
            f"{j['speedup']:>7.2f}x {j['quota_equal'] / MiB:>9.1f} → {j['quota_plan'] / MiB:.1f} MiB")
    for name, j in res["jobs"].items():
        log(f"{name}: wait {j['wait_equal_s']:.2f} → {j['wait_plan_s']:.2f} s, step {j['step_equal_s']:.2f} → {j['step_plan_s']:.2f} s per epoch")
    for k, v in res["goals"].items():
        log(f"goal {k}: {'met' if v else 'NOT met'}")
    log(f"elapsed {res['elapsed_s']:.0f} s; load {os.getloadavg()[0]:.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    if a.record:
        goals = {"prediction_within_10pct": "predicted epoch times within ±10% of measured (both jobs, under the plan)",
                 "io_speedup_ge_1.3": "the I/O-bound job's epoch ≥ 1.3x faster under the plan",
                 "gpu_slowdown_le_5pct": "the compute-bound job's epoch no more than 5% slower"}
        cmd = (f"python -m stallfree.bench --split --memory {a.memory} --item-size {a.item_size} --fraction {a.fraction} "
               f"--source-rate {a.source_rate} --compute {a.compute:g} --batch-size {a.batch_size} --epochs {a.epochs}")
        summary = {"command": cmd,
                   "date": date, "load": [load0, os.getloadavg()[0]], "memory": res["memory"], "items": res["items"],
                   "item_size": res["item_size"], "source_rate": res["source_rate"], "compute_s": res["compute_s"],
                   "epochs": a.epochs, "elapsed_s": res["elapsed_s"],
                   "jobs": [{"job": n, "equal_s": j["equal_s"], "plan_s": j["plan_s"], "predicted_s": j["predicted_s"],
                             "prediction_error": j["prediction_error"], "speedup": j["speedup"],
                             "quota_equal": j["quota_equal"], "quota_plan": j["quota_plan"],
                             "wait_equal_s": j["wait_equal_s"], "wait_plan_s": j["wait_plan_s"],
                             "step_equal_s": j["step_equal_s"], "step_plan_s": j["step_plan_s"]}
                            for n, j in res["jobs"].items()],
                   "goals": [{"goal": goals[k], "met": v} for k, v in res["goals"].items()]}
        with open(a.record, "w") as f:
            json.dump(summary, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
