"""The benches' shared helpers (stallfree.bench.common)."""

import os
import socket
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from stallfree.bench import common  # noqa: E402


class CommonTest(unittest.TestCase):
    def test_free_port_is_free(self):
        for _ in range(20):
            p = common.free_port()
            self.assertTrue(20000 <= p < 32768, f"{p}: not below the ephemeral range")
            s = socket.socket()
            s.bind(("127.0.0.1", p))  # nobody holds it
            s.close()

    def test_free_ports_are_never_handed_out_twice(self):
        # No port twice among the last _HELD drawn, and only those locks
        # held: a long run stays far from the process's file limit. Among
        # 1000 draws of 12768 ports, drawing alone would repeat one within
        # 64 draws about five times.
        ports = [common.free_port() for _ in range(1000)]
        for k in range(len(ports) - common._HELD + 1):
            window = ports[k:k + common._HELD]
            self.assertEqual(len(set(window)), len(window), f"a port twice in draws {k}..{k + common._HELD}")
        self.assertEqual(list(common._RESERVED), ports[-common._HELD:])

    def test_wait(self):
        done = threading.Event()
        threading.Timer(0.05, done.set).start()
        common.wait(done.is_set, 5, "the timer")
        self.assertTrue(done.is_set())
        calls = []

        def raising():
            calls.append(1)
            raise OSError("not up")
        t0 = time.monotonic()
        with self.assertRaisesRegex(RuntimeError, "the thing"):
            common.wait(raising, 0.2, "the thing", poll=0.01)
        self.assertGreaterEqual(time.monotonic() - t0, 0.2)
        self.assertGreater(len(calls), 2, "a raising condition is asked again")

    def test_cpu_figures(self):
        before, mine = common.proc_cpu(os.getpid()), common.own_cpu()
        t = time.process_time()
        while time.process_time() - t < 0.3:
            pass
        self.assertGreater(common.proc_cpu(os.getpid()), before)
        self.assertGreaterEqual(common.own_cpu() - mine, 0.25)
        self.assertEqual(common.proc_cpu(None), 0.0)
        self.assertTrue(common.cpu_model())

    def test_write_section(self):
        with tempfile.TemporaryDirectory() as d:
            doc = os.path.join(d, "B.md")
            with open(doc, "w") as f:
                f.write("# Benchmarks\n\nmake bench's part\n")
            common.write_section(doc, "<!-- a -->", "<!-- /a -->", "## A\n\nfirst")
            common.write_section(doc, "<!-- b -->", "<!-- /b -->", "## B\n\nother")
            common.write_section(doc, "<!-- a -->", "<!-- /a -->", "## A\n\nsecond")
            text = open(doc).read()
        self.assertTrue(text.startswith("# Benchmarks\n\nmake bench's part\n"))
        self.assertEqual(text.count(common.KEPT_MARKER), 1)
        self.assertIn("second", text)
        self.assertNotIn("first", text)
        self.assertLess(text.index("## A"), text.index("## B"), "a rewritten section keeps its place")


if __name__ == "__main__":
    unittest.main()
