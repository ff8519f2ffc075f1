"""README's Python steps name one interpreter, and the examples keep their
files out of the checkout (issue 47, item 6). The README's Python snippets
themselves run as written in TestReadmeQuickstarts (integration/)."""

import ast
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

from harness import ROOT

EXAMPLES = os.path.join(ROOT, "python", "examples")
# A command word python, python3 or pythonX.Y not written as /usr/bin/python3
# or a venv's bin/python (its pip too).
BARE_PYTHON = re.compile(r"(?:^|[\s;&|(`])(python(?:3(?:\.\d+)?)?)(?=\s)")


def bare_pythons(text):
    """The lines of text that run a python found on PATH."""
    return [line for line in text.splitlines() if BARE_PYTHON.search(line)]


class InterpreterTest(unittest.TestCase):
    def test_readme_shell_blocks_run_debians_python(self):
        with open(os.path.join(ROOT, "README.md")) as f:
            blocks = re.findall(r"^```sh\n(.*?)^```$", f.read(), re.S | re.M)
        self.assertGreater(len(blocks), 5)
        lines = [line for b in blocks for line in bare_pythons(b)]
        self.assertEqual(lines, [], "README sh blocks that run a python3 from PATH (pyenv's lacks torch and numpy): "
                                    "write /usr/bin/python3")

    def test_examples_docstrings_run_debians_python(self):
        for name in sorted(os.listdir(EXAMPLES)):
            if not name.endswith(".py"):
                continue
            with open(os.path.join(EXAMPLES, name)) as f:
                doc = ast.get_docstring(ast.parse(f.read())) or ""
            with self.subTest(example=name):
                commands = "\n".join(line for line in doc.splitlines() if line.startswith("    "))
                self.assertIn("/usr/bin/python3", commands, f"{name}'s docstring shows no command")
                self.assertEqual(bare_pythons(commands), [], f"{name}'s docstring runs a python3 from PATH")
                self.assertNotIn("cd python", doc, f"{name}: its command is run from the checkout's root")

    def test_the_check_catches_a_bare_python3(self):
        self.assertEqual(bare_pythons("cd python && python3 examples/train_stall.py"),
                         ["cd python && python3 examples/train_stall.py"])
        self.assertEqual(bare_pythons("python -m stallfree.bench --help"), ["python -m stallfree.bench --help"])
        self.assertEqual(bare_pythons("/usr/bin/python3 python/examples/train.py --epochs 5\n"
                                      "$venv/bin/python -m stallfree.bench\nPYTHONPATH=python /usr/bin/python3 x.py"), [])


class TrainCheckpointTest(unittest.TestCase):
    def load_train(self):
        spec = importlib.util.spec_from_file_location("train_example", os.path.join(EXAMPLES, "train.py"))
        mod = importlib.util.module_from_spec(spec)
        with mock.patch.object(sys, "dont_write_bytecode", True):  # no __pycache__ in python/examples
            spec.loader.exec_module(mod)
        return mod

    def test_default_checkpoint_is_outside_the_checkout(self):
        train = self.load_train()
        with tempfile.TemporaryDirectory() as tmp:
            with mock.patch.dict(os.environ, {"XDG_CACHE_HOME": tmp}):
                self.assertEqual(train.default_checkpoint(), os.path.join(tmp, "stallfree", "train-example.pt"))
            env = {k: v for k, v in os.environ.items() if k != "XDG_CACHE_HOME"}
            env["HOME"] = tmp
            with mock.patch.dict(os.environ, env, clear=True):
                self.assertEqual(train.default_checkpoint(),
                                 os.path.join(tmp, ".cache", "stallfree", "train-example.pt"))
            # What --help shows, run from the checkout's root as README does.
            out = subprocess.run([sys.executable, os.path.join(EXAMPLES, "train.py"), "--help"], cwd=ROOT,
                                 env=dict(os.environ, XDG_CACHE_HOME=tmp, PYTHONDONTWRITEBYTECODE="1"), capture_output=True, text=True,
                                 timeout=120)
            self.assertEqual(out.returncode, 0, out.stderr)
            self.assertIn(os.path.join(tmp, "stallfree", "train-example.pt"), " ".join(out.stdout.split()))
        self.assertFalse(os.path.abspath(train.default_checkpoint()).startswith(ROOT + os.sep),
                         f"train.py's default checkpoint {train.default_checkpoint()} is in the checkout")


if __name__ == "__main__":
    unittest.main()
