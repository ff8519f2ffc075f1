"""`pip install ./python` as README says, into a new venv, without a package
index: the installed package (every subpackage) imports from outside the
checkout."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from harness import ROOT


class InstallTest(unittest.TestCase):
    def test_pip_install_into_a_venv_with_debians_packages(self):
        tmp = tempfile.mkdtemp(prefix="stallfree-venv")
        self.addCleanup(shutil.rmtree, tmp, True)
        # A copy, so pip's in-tree build leaves nothing in the checkout.
        src = os.path.join(tmp, "python")
        shutil.copytree(os.path.join(ROOT, "python"), src, ignore=shutil.ignore_patterns("tests", "build", "*.egg-info", "__pycache__"))
        venv = os.path.join(tmp, "venv")
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True, timeout=120)
        py = os.path.join(venv, "bin", "python")
        out = subprocess.run([py, "-m", "pip", "install", "--no-index", "--no-build-isolation", src],
                             capture_output=True, text=True, timeout=300)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        code = ("import stallfree, stallfree.bench, stallfree.torch, importlib.metadata as m;"
                "print(stallfree.__file__); print(m.version('stallfree'));"
                "print(sorted(r.replace(' ', '') for r in m.requires('stallfree')))")
        got = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp)
        self.assertEqual(got.returncode, 0, got.stderr)
        where, version, requires = got.stdout.splitlines()
        self.assertTrue(where.startswith(venv), f"imported from {where}, not the venv")
        self.assertEqual(version, "0.1.0")
        self.assertIn("'msgpack(>=1.0)'", requires)
        self.assertIn("torch;extra=='torch'", requires)


if __name__ == "__main__":
    unittest.main()
