"""What every Python test needs: free ports, awaiting a condition, a real
cluster of cachenode processes and a temporary dataset on disk."""

import contextlib
import gc
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from stallfree import Client  # noqa: E402
from stallfree.bench.common import free_port  # noqa: E402,F401 - below the ephemeral range (harness users import it)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
BIN = os.environ.get("STALLFREE_BIN", os.path.join(ROOT, "bin", "cachenode"))


class PortTaken(Exception):
    """A node could not bind a port free_port() had handed out."""


class NodeExited(AssertionError):
    """A node stopped while the test waited for it."""


@contextlib.contextmanager
def without_cyclic_gc():
    """Runs the block with Python's cyclic garbage collector off, so that a
    buffer kept by a reference cycle stays kept and a test of reuse sees it
    (with the collector on, such a leak shows only now and then)."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def wait_until(cond, timeout, what, passes=()):
    """Polls cond until it is true; its exceptions mean "not yet", except
    those in passes, which end the wait at once."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if cond():
                return
        except passes:
            raise
        except Exception:  # noqa: BLE001 - not up yet
            pass
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Cluster:
    """n cachenode processes on loopback, the first bootstrapping. A port
    free_port() handed out can be taken by another process before the node
    binds it: a start that fails so is tried again on fresh ports."""

    def __init__(self, tmp, n=2, attempts=3):
        for attempt in range(attempts):
            try:
                self._start(os.path.join(tmp, f"try{attempt}") if attempt else tmp, n)
                return
            except PortTaken:
                self.stop()
            except BaseException:
                self.stop()  # no node outlives a failed start
                raise
        raise AssertionError(f"no free ports for {n} nodes in {attempts} attempts")

    def _start(self, tmp, n):
        self.nodes, self.procs, self.logs = [], [], []
        seed_gossip = None
        for i in range(n):
            name = f"py{i + 1}"
            http, gossip = free_port(), free_port()
            args = [BIN, "--name", name, "--http", f"127.0.0.1:{http}", "--peer", f"127.0.0.1:{free_port()}",
                    "--gossip", f"127.0.0.1:{gossip}", "--raft", f"127.0.0.1:{free_port()}",
                    "--data-dir", os.path.join(tmp, name), "--memory", "64MiB", "--fast-timers", "--log-level", "warn"]
            args += ["--bootstrap"] if seed_gossip is None else ["--join", f"127.0.0.1:{seed_gossip}"]
            seed_gossip = seed_gossip or gossip
            os.makedirs(tmp, exist_ok=True)
            path = os.path.join(tmp, name + ".log")
            log = open(path, "w")
            self.procs.append(subprocess.Popen(args, stdout=log, stderr=log))
            self.logs.append(path)
            self.nodes.append((name, f"http://127.0.0.1:{http}"))
        c = Client(self.nodes[0][1])

        def up():
            self._check_running()
            return (sum(m["state"] == "alive" for m in c.json("GET", "/v1/cluster")["members"]) == n
                    and c.json("GET", "/v1/cluster")["leader"])
        wait_until(up, 30, "cluster", passes=(PortTaken, NodeExited))

    def _check_running(self):
        for p, path in zip(self.procs, self.logs):
            if p.poll() is None:
                continue
            with open(path, errors="replace") as f:
                log = f.read()
            if "address already in use" in log:
                raise PortTaken(log)
            raise NodeExited(f"a node exited with {p.returncode}: {log[-2000:]}")

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(timeout=15)


class ClusterCase(unittest.TestCase):
    """A temporary directory, random files in it, and a real cluster."""

    def make_tmp(self, prefix):
        self.tmp = tempfile.mkdtemp(prefix=prefix)

    def write_files(self, count, seed, key, base, span):
        """count files of random bytes under self.data: file i is key(i), of
        base + randrange(span) bytes."""
        self.data = os.path.join(self.tmp, "data")
        rnd = random.Random(seed)
        self.files = {}
        for i in range(count):
            k = key(i)
            b = rnd.randbytes(base + rnd.randrange(span))
            os.makedirs(os.path.join(self.data, os.path.dirname(k)), exist_ok=True)
            with open(os.path.join(self.data, k), "wb") as f:
                f.write(b)
            self.files[k] = b
        self.keys = sorted(self.files)

    def tearDown(self):
        self.cluster.stop()
        shutil.rmtree(self.tmp, ignore_errors=True)


class TokenNodeCase(unittest.TestCase):
    """One node started with a token (``token``) in a temporary directory,
    at ``self.url``, with one file to register: data/a.bin, b"abc" * 100.
    The node's data directory is n/ (its socket: n/stallfree.sock)."""

    token = "token"

    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="stallfree-tok")
        with open(os.path.join(self.tmp, "token"), "w") as f:
            f.write(self.token + "\n")
        os.makedirs(os.path.join(self.tmp, "data"))
        with open(os.path.join(self.tmp, "data", "a.bin"), "wb") as f:
            f.write(b"abc" * 100)
        self.url = f"http://127.0.0.1:{free_port()}"
        self.log = open(os.path.join(self.tmp, "node.log"), "w")
        self.proc = subprocess.Popen([BIN, "--name", "tok", "--bootstrap", "--http", self.url[7:],
                                      "--peer", f"127.0.0.1:{free_port()}", "--gossip", f"127.0.0.1:{free_port()}",
                                      "--raft", f"127.0.0.1:{free_port()}", "--data-dir", os.path.join(self.tmp, "n"),
                                      "--memory", "64MiB", "--fast-timers", "--log-level", "warn",
                                      "--token-file", os.path.join(self.tmp, "token")], stdout=self.log, stderr=self.log)

    def tearDown(self):
        self.proc.terminate()
        self.proc.wait(timeout=15)
        self.log.close()
        shutil.rmtree(self.tmp, ignore_errors=True)
