"""``python -m stallfree.bench --checkpoint``: checkpoints in peer memory.

Measures, in one run on this machine:

1. the time the training loop is blocked by ``Checkpointer.save()`` for a
   ~100 MB and a ~1 GB state, against ``torch.save`` into a BytesIO (goal
   ≤ 1.2×) and ``torch.save`` to a local file with fsync;
2. replication throughput (a part PUT to a node, stored there and streamed
   on to its partner) against one raw loopback TCP stream (goal ≥ 0.7×);
3. restore (``Checkpointer.load()``) from peer memory against from MinIO
   through the S3 persist, both peers gone (goal ≥ 3×);
4. a simulation of 200 random two-node failures of an N-node cluster
   (N = 4, 8, 16): the fraction of checkpoint steps unreadable from memory,
   next to the pair scheme's 1/(N−1), and with persist (0).

Starts its own three nodes (and a MinIO server: ``STALLFREE_MINIO`` or
``scripts/minio.sh``) on loopback and stops them at the end.
"""

import argparse
import io
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import threading
import time

from ..checkpoint import Checkpointer, _Summer
from ..client import Client
from .common import cpu_model, free_port, load_avg, log, own_cpu, proc_cpu, wait, write_section

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


# -- processes -----------------------------------------------------------------

class MinIO:
    USER, PASSWORD = "stallfree-bench", "stallfree-bench-secret"

    def __init__(self, tmp):
        binary = os.environ.get("STALLFREE_MINIO") or subprocess.run(
            [os.path.join(ROOT, "scripts", "minio.sh")], capture_output=True, text=True, check=True).stdout.strip()
        self.addr = f"127.0.0.1:{free_port()}"
        env = dict(os.environ, MINIO_ROOT_USER=self.USER, MINIO_ROOT_PASSWORD=self.PASSWORD)
        self.log = open(os.path.join(tmp, "minio.log"), "w")
        self.proc = subprocess.Popen([binary, "server", os.path.join(tmp, "minio"), "--address", self.addr,
                                      "--console-address", f"127.0.0.1:{free_port()}", "--quiet"],
                                     env=env, stdout=self.log, stderr=self.log)
        self.endpoint = "http://" + self.addr
        import boto3  # Debian's python3-boto3

        self.s3 = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=self.USER,
                               aws_secret_access_key=self.PASSWORD, region_name="us-east-1")
        wait(lambda: self.s3.list_buckets() is not None, 30, "MinIO")
        self.s3.create_bucket(Bucket="ckpt")

    def stop(self):
        self.proc.terminate()
        self.proc.wait(15)


class Nodes:
    def __init__(self, tmp, n, extra=(), env=None):
        binary = os.environ.get("STALLFREE_BIN", os.path.join(ROOT, "bin", "cachenode"))
        self.urls, self.procs, seed = [], [], None
        # The parts' files go in a tmpfs directory of the bench's own (as in
        # /dev/shm, where a node keeps them by default), removed by stop():
        # the nodes this bench SIGKILLs cannot remove theirs.
        shm_root = "/dev/shm" if os.access("/dev/shm", os.W_OK) else tmp
        self.shm = tempfile.mkdtemp(prefix="stallfree-bench-", dir=shm_root)
        extra = ("--shm-dir", self.shm, *extra)
        for i in range(n):
            name = f"ck{i + 1}"
            http, gossip = free_port(), free_port()
            args = [binary, "--name", name, "--http", f"127.0.0.1:{http}", "--peer", f"127.0.0.1:{free_port()}",
                    "--gossip", f"127.0.0.1:{gossip}", "--raft", f"127.0.0.1:{free_port()}",
                    "--data-dir", os.path.join(tmp, name), "--memory", "64MiB", "--fast-timers",
                    "--log-level", "warn", "--checkpoint-memory", "3GiB", "--dead-grace", "10m", *extra]
            args += ["--bootstrap"] if seed is None else ["--join", f"127.0.0.1:{seed}"]
            seed = seed or gossip
            out = open(os.path.join(tmp, name + ".log"), "w")
            self.procs.append(subprocess.Popen(args, stdout=out, stderr=out, env=env))
            self.urls.append(f"http://127.0.0.1:{http}")
        c = Client(self.urls[0])
        wait(lambda: sum(m["state"] == "alive" for m in c.json("GET", "/v1/cluster")["members"]) == n
             and c.json("GET", "/v1/cluster")["leader"], 60, "cluster")

    def kill(self, i):
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait()

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            p.wait(15)
        shutil.rmtree(self.shm, ignore_errors=True)


# -- measurements ----------------------------------------------------------------

def make_state(torch, mbytes):
    """A model-like state: float32 tensors of 16 MiB (the last one smaller)."""
    n = mbytes * 1_000_000 // 4
    per = 4 << 20
    state, i = {}, 0
    while n > 0:
        k = min(per, n)
        state[f"layer{i}.weight"] = torch.randn(k)
        n -= k
        i += 1
    return state


def timed(f, repeat):
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def quiesce(url):
    """Waits until the cluster has persisted every committed step: the
    leader's background persist competes for the same cores."""
    c = Client(url)
    wait(lambda: all(st["persisted"] for ck in c.json("GET", "/v1/checkpoints") for st in ck["steps"]),
         600, "background persists")


def blocked(torch, url, sizes, repeat, tmp, persist):
    """The three ways of saving, interleaved so that each run meets the same
    allocator state, each on a quiet machine (no upload or persist running)."""
    rows = []
    for mb in sizes:
        state = make_state(torch, mb)
        path = os.path.join(tmp, "ckpt.pt")

        def to_bytesio():
            b = io.BytesIO()
            torch.save(state, b)
            return b

        def to_file():
            with open(path, "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            os.remove(path)

        to_bytesio()  # warm the allocator
        ck = Checkpointer(url, f"bench-{mb}")
        mem, files, saves, uploads = [], [], [], []
        for r in range(repeat):
            mem.append(timed(to_bytesio, 1))
            files.append(timed(to_file, 1))
            t0 = time.perf_counter()
            fut = ck.save(r + 1, state)
            saves.append(time.perf_counter() - t0)
            fut.result()
            uploads.append(ck.upload_seconds)
            if persist:
                quiesce(url)
        size = ck.snapshot_bytes
        ck.close()
        Client(url).request("DELETE", f"/v1/checkpoints/bench-{mb}")
        t_save, t_mem, t_file, t_up = (statistics.median(x) for x in (saves, mem, files, uploads))
        rows.append({"state_mb": round(size / 1e6), "save_blocked_s": t_save, "torch_save_bytesio_s": t_mem,
                     "torch_save_file_fsync_s": t_file, "ratio_vs_bytesio": t_save / t_mem,
                     "ratio_vs_file": t_save / t_file, "upload_s": t_up, "upload_gb_s": size / t_up / 1e9})
        log(f"blocked {mb} MB: {rows[-1]}")
        del state
    return rows


def raw_tcp_once(buf, srv):
    """One loopback TCP stream: sendall of buf into recv_into; seconds."""
    nbytes = len(buf)
    sink = bytearray(1 << 20)

    def recv():
        c, _ = srv.accept()
        mv, got = memoryview(sink), 0
        while got < nbytes:
            n = c.recv_into(mv)
            if n == 0:
                break
            got += n
        c.sendall(b"k")
        c.close()

    th = threading.Thread(target=recv)
    th.start()
    s = socket.create_connection(srv.getsockname())
    t0 = time.perf_counter()
    s.sendall(memoryview(buf))
    s.recv(1)  # the receiver has it all
    took = time.perf_counter() - t0
    s.close()
    th.join()
    return took


def replication(nodes, nbytes, repeat):
    """A part PUT to ck1: stored there and streamed to its partner ck2; 201
    once both hold it; the checksum is computed beforehand (not timed). Each
    PUT alternates with one raw loopback TCP stream of the same bytes, so
    both meet the same moments of a shared machine. Measured with each
    checksum algorithm (crc32c, Checkpointer's default where the crc32c
    module is hardware-based, and sha256), with
    the CPU seconds per GB each of the two nodes spent."""
    url = nodes.urls[0]
    body = os.urandom(1 << 20) * (nbytes >> 20)
    c = Client(url, timeout=600)
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    pids = [nodes.procs[0].pid, nodes.procs[1].pid]
    out = {}
    for algo in ("crc32c", "sha256"):
        h = _Summer(algo)
        h.update(body)
        header = h.header()
        times, raw, cpu = [], [], [0.0, 0.0]
        for r in range(repeat):
            raw.append(raw_tcp_once(body, srv))
            cpu0 = [proc_cpu(p) for p in pids]
            t0 = time.perf_counter()
            c.request("PUT", f"/v1/checkpoints/bench-repl/steps/{r}/parts/0", body=memoryview(body),
                      headers={"X-Checksum": header, "Content-Type": "application/octet-stream"})
            times.append(time.perf_counter() - t0)
            cpu = [acc + proc_cpu(p) - c0 for acc, p, c0 in zip(cpu, pids, cpu0)]
            # Dropped as a checkpoint series drops its old steps: the next
            # part of this size reuses the mappings.
            c.request("DELETE", "/v1/checkpoints/bench-repl")
        gb = repeat * nbytes / 1e9
        out[algo] = {"gb_s": nbytes / statistics.median(times) / 1e9, "raw_tcp_gb_s": nbytes / statistics.median(raw) / 1e9,
                     "cpu_s_per_gb_receiver": cpu[0] / gb, "cpu_s_per_gb_partner": cpu[1] / gb}
        out[algo]["ratio"] = out[algo]["gb_s"] / out[algo]["raw_tcp_gb_s"]
        log(f"replication {algo}: {out[algo]}")
    srv.close()
    return out


def raw_fetch_once(buf, srv):
    """One loopback TCP stream received into a buffer of its own (what a
    fetch of the same bytes has to beat); seconds."""
    return raw_tcp_once(buf, srv)


def restore(torch, nodes, mb, repeat, with_minio):
    """Checkpointer.load() of a step rank 0 wrote through ck1 (held by ck1
    and ck2): through ck1 (its own memory: a rank restarted on its machine)
    and through ck3 (a peer's memory: a rank restarted elsewhere), against
    torch.load from a BytesIO of the same bytes; the bytes alone (every part
    GET through ck3) against one raw loopback stream of as many bytes; and,
    with MinIO, ck1 and ck2 killed, through ck3 from the S3 persist."""
    state = make_state(torch, mb)
    buf = io.BytesIO()
    torch.save(state, buf)
    raw_bytes = buf.getvalue()
    Checkpointer(nodes.urls[0], "bench-restore").save(1, state).result()
    del state
    local = Checkpointer(nodes.urls[0], "bench-restore")
    reader = Checkpointer(nodes.urls[2], "bench-restore")
    wait(lambda: reader.steps() and (not with_minio or reader.steps()[-1]["persisted"]), 600, "the step committed (and persisted)")
    size = reader.steps()[-1]["bytes"]
    parts = reader.steps()[-1]["parts"]
    c = Client(nodes.urls[2], timeout=600)

    def get_all():
        for p in parts:
            c.request("GET", f"/v1/checkpoints/bench-restore/steps/1/parts/{p}")

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    t_raw = statistics.median([raw_tcp_once(raw_bytes, srv) for _ in range(repeat)])
    srv.close()
    t_torch = timed(lambda: torch.load(io.BytesIO(raw_bytes)), repeat)
    # CPU of the loading process and of every node, per GB loaded.
    pids = [p.pid for p in nodes.procs]
    gb = repeat * size / 1e9

    def with_cpu(f):
        own0, nodes0 = own_cpu(), sum(proc_cpu(p) for p in pids)
        t = timed(f, repeat)
        return t, (own_cpu() - own0) / gb, (sum(proc_cpu(p) for p in pids) - nodes0) / gb

    # Through ck1, which holds the parts: with --shm-dir they are mapped
    # (nothing crosses a socket), else fetched over its socket.
    mapped = all(m is not None for m in local._map_local(1, parts, {p["part"]: p["bytes"] for p in
                 c.json("GET", "/v1/checkpoints/bench-restore/steps/1/parts")["parts"]}))
    t_local, cpu_local_loader, cpu_local_nodes = with_cpu(lambda: local.load())
    t_fetch = timed(lambda: reader._fetch(1, parts), repeat)  # parts in parallel into one buffer, checked
    t_mem_get = timed(get_all, repeat)
    t_mem, cpu_loader, cpu_nodes = with_cpu(lambda: reader.load())
    out = {"state_mb": round(size / 1e6), "checksum": reader.checksum, "torch_load_bytesio_s": t_torch,
           "load_own_memory_s": t_local, "load_own_memory_mapped": mapped, "ratio_local_vs_torch": t_local / t_torch,
           "cpu_s_per_gb_loader_local": cpu_local_loader, "cpu_s_per_gb_nodes_local": cpu_local_nodes,
           "load_peer_memory_s": t_mem, "ratio_load_vs_torch": t_mem / t_torch,
           "fetch_peer_memory_gb_s": size / t_fetch / 1e9, "raw_tcp_gb_s": len(raw_bytes) / t_raw / 1e9,
           "ratio_fetch_vs_raw": (size / t_fetch) / (len(raw_bytes) / t_raw),
           "get_peer_memory_gb_s": size / t_mem_get / 1e9,
           "cpu_s_per_gb_loader": cpu_loader, "cpu_s_per_gb_nodes": cpu_nodes}
    if with_minio:
        nodes.kill(0)
        nodes.kill(1)
        r, _ = c.request("GET", f"/v1/checkpoints/bench-restore/steps/1/parts/{parts[0]}")
        assert r.getheader("X-Checkpoint-From") == "persisted", r.getheader("X-Checkpoint-From")
        out["get_minio_gb_s"] = size / timed(get_all, repeat) / 1e9
        out["load_minio_s"] = timed(lambda: reader.load(), repeat)
    return out


def pairs(members):
    """The pair (or last triple) groups of checkpoint.Partner, in Python."""
    n = len(members)
    groups = [members[i:i + 2] for i in range(0, n - n % 2, 2)]
    if n % 2:
        groups[-1] = groups[-1] + [members[-1]]
    return groups


def simulate(ns, trials, seed=37):
    """Every node writes its rank's part of every step to itself and its
    partner, so a step is unreadable from memory when some part lost both
    copies: the two failed nodes are a writer and its partner (in a pair,
    the pair). Such a failure takes every step held in memory at once, so
    the fraction of steps lost is the fraction of failures that hit a pair.
    With persist every committed step is also in storage: none is lost."""
    rnd = random.Random(seed)
    rows = []
    for n in ns:
        members = [f"n{i:02d}" for i in range(n)]
        groups = pairs(members)
        lost = 0
        for _ in range(trials):
            dead = set(rnd.sample(members, 2))
            lost += any(_group_loses(g, dead) for g in groups)
        rows.append({"N": n, "trials": trials, "unreadable_from_memory": lost / trials,
                     "pair_scheme_1_over_N_minus_1": 1 / (n - 1), "unreadable_with_persist": 0.0})
    return rows


def _group_loses(g, dead):
    """A pair loses its parts when both die; in a group of three each node
    copies to the next, so any two of the three dead lose the part one of
    them wrote."""
    return any(g[i] in dead and g[(i + 1) % len(g)] in dead for i in range(len(g)))


def main(argv):
    ap = argparse.ArgumentParser(prog="python -m stallfree.bench --checkpoint")
    ap.add_argument("--checkpoint", action="store_true")
    ap.add_argument("--sizes", default="100,1000", help="state sizes in MB")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--repl-mb", type=int, default=256)
    ap.add_argument("--restore-mb", type=int, default=1000)
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--no-minio", action="store_true", help="no MinIO: skip the persisted-copy row (the rest is measured)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--doc", help="also write the results as the checkpoint section of this BENCHMARKS.md")
    a = ap.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    out = {"load_before": load_avg()}
    tmp = tempfile.mkdtemp(prefix="sf-bench-ckpt-")
    minio = nodes = None
    try:
        extra, env = [], None
        if not a.no_minio:
            minio = MinIO(tmp)
            extra = ["--s3-endpoint", minio.endpoint, "--checkpoint-persist", "s3://ckpt/bench"]
            env = dict(os.environ, AWS_ACCESS_KEY_ID=MinIO.USER, AWS_SECRET_ACCESS_KEY=MinIO.PASSWORD)
        nodes = Nodes(tmp, 3, extra, env)
        log("nodes up;", load_avg())
        out["blocked"] = blocked(torch, nodes.urls[0], [int(s) for s in a.sizes.split(",")], a.repeat, tmp,
                                 not a.no_minio)
        out["replication"] = replication(nodes, a.repl_mb << 20, max(a.repeat, 5))
        out["restore"] = restore(torch, nodes, a.restore_mb, a.repeat, not a.no_minio)
        log(f"restore: {out['restore']}")
    finally:
        if nodes:
            nodes.stop()
        if minio:
            minio.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out["simulation"] = simulate([4, 8, 16], a.trials)
    out["load_after"] = load_avg()
    if a.json:
        print(json.dumps(out, indent=1))
        return 0
    text = markdown(out, a)
    print(text)
    if a.doc:
        write_section(a.doc, BEGIN, END, text)
    return 0


PROFILE_NOTE = """
Where the time goes (pprof of two nodes under 8 PUTs of 256 MiB with crc32c, 2026-11-27): the node written to
spends 0.88 CPU-s per GB (receive syscalls 0.33, send-on syscalls 0.29, crc32c 0.13, which runs beside the copy in
a goroutine of its own), its partner 0.55 (receive 0.32, crc32c 0.12). A replicated part crosses the kernel four
times (client send, node receive, node send, partner receive) where one raw stream crosses it twice, so with the
client, both nodes and the stream sharing two cores the ratio stays near 0.5 whatever the code; on separate hosts
the node's receive and send go to different links. A fetch over a socket is bound on the Python side: Debian's
`python3-crc32c` 2.3 is built without SSE4.2 (`crc32c.hardware_based` is False), checks 1–1.7 GB/s on one core
and holds the GIL (two threads take twice as long), and the parts are read through `http.client`; plain GETs of
the same parts run at 1.5 GB/s. `torch.load` of a buffer it reads in place is fast (0.1 s for 1 GB), so a fetched
`load()` is the fetch. On the node's host none of that runs: the parts are mapped where the node holds them
(checked once, by the node, in Go's hardware crc32c, when they were stored), and `load()` is `torch.load`
reading those mappings. What is left over `torch.load` from a BytesIO is one copy of every byte out of the node's
shared memory into the tensors (0.16–0.18 s per GB on this machine, the same through `mmap`, `mmap` with
`MAP_POPULATE` or `preadv`: `python -m stallfree.bench --micro`, 2026-11-27 10:34 UTC, load 0.38); a load from a BytesIO copies from memory the process has already touched. Zero copies would need
`torch.load(path, mmap=True)` (torch ≥ 2.1) over a state held as one file.
"""

BEGIN, END = "<!-- checkpoint-bench: written by python -m stallfree.bench --checkpoint -->", "<!-- /checkpoint-bench -->"
SECTION = "## Checkpoints in peer memory"


def markdown(out, a):
    w = []
    w.append(f"""{SECTION}

`make build && cd python && /usr/bin/python3 -m stallfree.bench --checkpoint --sizes {a.sizes} --repeat {a.repeat}
--restore-mb {a.restore_mb} --repl-mb {a.repl_mb}{' --no-minio' if a.no_minio else ''} --doc ../BENCHMARKS.md` ({os.cpu_count()} cores, {cpu_model()};
torch with one thread; three `cachenode`s with `--fast-timers`{'' if a.no_minio else ' and a MinIO server'} on loopback{'' if a.no_minio else ', `--checkpoint-persist s3://ckpt/bench`'}).
**Machine load: {out['load_before']} before the run, {out['load_after'].replace('load average ', '')} after**
(no other work on the machine; the load during the run is the bench's own: three nodes, MinIO and the client on
two cores): every figure is a median of {a.repeat} under that load; compare ratios within one
run only.

| state | `save()` blocks the loop | `torch.save` → BytesIO | ratio (goal ≤ 1.2×) | `torch.save` → file + fsync | ratio | upload + commit (background) |
|---|---|---|---|---|---|---|""")
    for r in out["blocked"]:
        w.append(f"| {r['state_mb']} MB | {r['save_blocked_s']:.3f} s | {r['torch_save_bytesio_s']:.3f} s | "
                 f"**{r['ratio_vs_bytesio']:.2f}×** | {r['torch_save_file_fsync_s']:.3f} s | {r['ratio_vs_file']:.2f}× | "
                 f"{r['upload_s']:.2f} s ({r['upload_gb_s']:.2f} GB/s) |")
    rep = out["replication"]
    w.append(f"""
`save()` is a `torch.save` into a BytesIO plus a hand-off to the upload thread; the three ways run interleaved,
each on a quiet cluster (no upload or persist running).

| replication: a {a.repl_mb} MiB part PUT to a node, stored there and streamed on to its partner (201 once both hold it), each checking the X-Checksum | crc32c (the default) | sha256 |
|---|---|---|
| part throughput | {rep['crc32c']['gb_s']:.2f} GB/s | {rep['sha256']['gb_s']:.2f} GB/s |
| one raw loopback TCP stream (Python `sendall` → `recv_into`), alternating with the PUTs | {rep['crc32c']['raw_tcp_gb_s']:.2f} GB/s | {rep['sha256']['raw_tcp_gb_s']:.2f} GB/s |
| ratio (goal ≥ 0.7×) | **{rep['crc32c']['ratio']:.2f}×** | {rep['sha256']['ratio']:.2f}× |
| CPU-s per GB: the node written to (receive, checksum, send on) / its partner (receive, checksum) | {rep['crc32c']['cpu_s_per_gb_receiver']:.2f} / {rep['crc32c']['cpu_s_per_gb_partner']:.2f} | {rep['sha256']['cpu_s_per_gb_receiver']:.2f} / {rep['sha256']['cpu_s_per_gb_partner']:.2f} |
""")
    r = out["restore"]
    w.append(f"""| restore of a {r['state_mb']} MB state ({r['checksum']}) | measured | goal |
|---|---|---|
| `torch.load` from a BytesIO of the same bytes (the floor) | {r['torch_load_bytesio_s']:.2f} s | |
| `Checkpointer.load()` through the node holding the parts (a rank restarted on its machine): {'each part mapped from the node’s shared memory (`?map=1`), nothing sent or hashed again' if r.get('load_own_memory_mapped') else 'parts fetched over its socket (no `--shm-dir`)'} | {r['load_own_memory_s']:.2f} s (**{r['ratio_local_vs_torch']:.2f}×** `torch.load`); CPU-s per GB: loading process {r['cpu_s_per_gb_loader_local']:.2f}, the nodes {r['cpu_s_per_gb_nodes_local']:.2f} | ≤ 1.3× |
| `Checkpointer.load()` through another node, from a peer's memory: parts in parallel into one buffer, checked as they arrive, `torch.load` reading that buffer in place | {r['load_peer_memory_s']:.2f} s ({r['ratio_load_vs_torch']:.2f}× `torch.load`); CPU-s per GB: loading process {r['cpu_s_per_gb_loader']:.2f}, the nodes {r['cpu_s_per_gb_nodes']:.2f} | |
| the fetch alone (every part into one buffer, checked) from a peer's memory, against one raw loopback TCP stream of the state's bytes | {r['fetch_peer_memory_gb_s']:.2f} against {r['raw_tcp_gb_s']:.2f} GB/s: **{r['ratio_fetch_vs_raw']:.2f}×** | ≥ 0.7× |
| plain GETs of every part through the third node | {r['get_peer_memory_gb_s']:.2f} GB/s | |
""")
    if "load_minio_s" in r:
        w.append(f"""| for contrast: MinIO on this host, served from its page cache (both holders killed, `X-Checkpoint-From: persisted`) | measured |
|---|---|
| `Checkpointer.load()` | {r['load_minio_s']:.2f} s |
| GETs of every part | {r['get_minio_gb_s']:.2f} GB/s |
""")
    else:
        w.append("MinIO row skipped (`--no-minio`).\n")
    w.append(PROFILE_NOTE)
    w.append("""
Simulation (`simulate()` in the bench): random two-node failures of an N-node cluster whose every node writes
its rank's part of every step to itself and its partner (the pairs of `checkpoint.Partner`); a step is
unreadable from memory when some part lost both copies, which the failure of one whole pair causes for every
step in memory at once. With `--checkpoint-persist` those steps are read from storage
(`TestCheckpointPeerMemory` kills both nodes of a pair and reads byte-exact from the persisted copy).

| N | failures | steps unreadable from memory | pair scheme 1/(N−1) | with persist |
|---|---|---|---|---|""")
    for r in out["simulation"]:
        w.append(f"| {r['N']} | {r['trials']} | {r['unreadable_from_memory']:.3f} | "
                 f"{r['pair_scheme_1_over_N_minus_1']:.3f} | {r['unreadable_with_persist']:.0f} |")
    return "\n".join(w) + "\n"
