"""Benchmarks a user can run: ``python -m stallfree.bench [--prep | --group J |
--checkpoint | --split] [options]``.

Each mode lives in a module of its own (``loader``, ``prep``, ``group``,
``checkpoint``, ``split``) with a ``main(argv)``; ``__main__`` only picks one.
Progress goes to stderr, results to stdout as a table (or JSON with ``--json``).
"""
