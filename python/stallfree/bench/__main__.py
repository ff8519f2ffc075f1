"""Picks the benchmark mode and hands the remaining arguments to it."""

import importlib
import sys

# flag -> module; the loader bench is the default. A mode whose flag takes a
# value (--group J) receives the flag and its value among its arguments.
MODES = {
    "--prep": "prep",
    "--group": "group",
    "--checkpoint": "checkpoint",
    "--split": "split",
    "--train": "train",
    "--micro": "micro",
}


def main(argv):
    module = "loader"
    for flag, name in MODES.items():
        if any(a == flag or a.startswith(flag + "=") for a in argv):
            module = name
            break
    try:
        mod = importlib.import_module(f"stallfree.bench.{module}")
    except ModuleNotFoundError as e:
        if e.name != f"stallfree.bench.{module}":
            raise
        sys.exit(f"stallfree.bench: mode {module!r} is not available in this version")
    return mod.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
