"""On PYTHONPATH, makes `import PIL` fail as on a machine without Pillow:
PYTHONPATH=python/tests/no_pillow python3 -m unittest discover -s python/tests
runs the suite as if Pillow were not installed."""

import sys

sys.modules["PIL"] = None  # a None entry makes every import of PIL raise ImportError
