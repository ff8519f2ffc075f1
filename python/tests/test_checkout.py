"""What the two README commands leave behind: `make demo` writes its data and
state outside the checkout, and the one long build step says what it builds,
why, where and for how long before it starts."""

import os
import shutil
import subprocess
import tempfile
import unittest

from harness import ROOT, free_port


def git_status():
    return subprocess.run(["git", "-C", ROOT, "status", "--porcelain"], capture_output=True, text=True, check=True).stdout


class CheckoutTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="stallfree-checkout")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def test_demo_leaves_the_checkout_clean(self):
        before = git_status()
        env = dict(os.environ, XDG_CACHE_HOME=self.tmp, DEMO_ITEMS="40", DEMO_SIZE="4KiB",
                   DEMO_HTTP=f"127.0.0.1:{free_port()}", DEMO_RAFT=f"127.0.0.1:{free_port()}",
                   DEMO_PEER=f"127.0.0.1:{free_port()}", DEMO_GOSSIP=f"127.0.0.1:{free_port()}")
        out = subprocess.run([os.path.join(ROOT, "scripts", "demo.sh")], env=env, capture_output=True, text=True,
                             timeout=300)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        work = os.path.join(self.tmp, "stallfree", "demo")
        self.assertEqual(len(os.listdir(os.path.join(work, "data", "class000"))) > 0, True)
        self.assertTrue(os.path.exists(os.path.join(work, "state")))
        self.assertIn(work, out.stdout, "the demo says where its files are")
        self.assertEqual(git_status(), before, "make demo changed what git status shows")

    def test_minio_build_is_announced_before_it_starts(self):
        fake = os.path.join(self.tmp, "fakebin")
        os.makedirs(fake)
        with open(os.path.join(fake, "go"), "w") as f:
            f.write("#!/bin/sh\necho GO-STARTED >&2\nexit 1\n")
        os.chmod(os.path.join(fake, "go"), 0o755)
        env = dict(os.environ, XDG_CACHE_HOME=self.tmp, PATH=fake + os.pathsep + os.environ["PATH"])
        out = subprocess.run([os.path.join(ROOT, "scripts", "minio.sh")], env=env, capture_output=True, text=True,
                             timeout=60)
        self.assertNotEqual(out.returncode, 0)
        said, _, _ = out.stderr.partition("GO-STARTED")
        self.assertIn("GO-STARTED", out.stderr)
        for what in ("building the MinIO server", "S3 tests", os.path.join(self.tmp, "stallfree"), "minutes", "once"):
            self.assertIn(what, said, f"not said before the build starts: {what!r}\n{out.stderr}")


if __name__ == "__main__":
    unittest.main()
