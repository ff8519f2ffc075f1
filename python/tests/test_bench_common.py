"""The benches' shared helpers (stallfree.bench.common)."""

import os
import shutil
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

    def test_memory_note(self):
        """The note names a balloon that reports free pages, and nothing
        else: another virtio device, a balloon without the feature bit,
        unreadable files, no virtio at all."""
        def sysfs(devices):
            d = tempfile.mkdtemp()
            self.addCleanup(shutil.rmtree, d)
            for name, (device, features) in devices.items():
                os.makedirs(os.path.join(d, name))
                with open(os.path.join(d, name, "device"), "w") as f:
                    f.write(device + "\n")
                if features is not None:
                    with open(os.path.join(d, name, "features"), "w") as f:
                        f.write(features + "\n")
            return d

        reporting = "0110010100000000000000000000000010000000"  # this VM's balloon: bit 5 set
        self.assertIn("free page reporting", common.memory_note(sysfs({"virtio0": ("0x0005", reporting)})))
        self.assertIn("free page reporting", common.memory_note(sysfs({
            "virtio0": ("0x0001", "1" * 40), "virtio1": ("0x0005", reporting)})))
        for devices in ({"virtio0": ("0x0005", "0110000100000000")},  # a balloon, no reporting
                        {"virtio0": ("0x0001", reporting)},  # a network card with bit 5
                        {"virtio0": ("0x0005", "01100")},  # too few bits
                        {"virtio0": ("0x0005", None)},  # no features file
                        {"virtio0": ("balloon", reporting)}):  # unreadable id
            self.assertEqual(common.memory_note(sysfs(devices)), "", devices)
        self.assertEqual(common.memory_note("/nonexistent/virtio"), "")

    def test_fresh_memory_script(self):
        """scripts/fresh-memory.py prints its machine line and one row a
        round, a figure (CPU µs, never negative) in each of its four columns."""
        import subprocess

        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "fresh-memory.py")
        for args in ([], ["--small-pages"]):
            out = subprocess.run([sys.executable, script, "--mib", "8", "--pause", "0", "--rounds", "2"] + args,
                                 capture_output=True, text=True, timeout=120, check=True).stdout.splitlines()
            self.assertIn("8 MiB a row, CPU µs per 4 KiB page", out[0])
            self.assertIn("without" if args else "with", out[0])
            rows = [line for line in out if line.startswith("| ") and line[2].isdigit()]
            self.assertEqual([r.split("|")[1].strip() for r in rows], ["1", "2"], out)
            for row in rows:
                figures = [float(x) for x in row.strip("|").split("|")[1:]]
                self.assertEqual(len(figures), 4, row)
                self.assertTrue(all(f >= 0 for f in figures), row)

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
