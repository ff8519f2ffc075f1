"""Decoding WebDataset samples by extension, with optional dependencies only."""

import io
import json

IMAGE_EXTS = {"jpg", "jpeg", "png", "ppm", "pgm", "bmp", "webp"}


def decode(sample, images="pil"):
    """Returns a copy of a sample dict with its parts decoded by extension
    (the part of the name after the first dot, so ``seg.png`` decodes as png):
    ``cls``/``index``/``idx``/``id`` -> int, ``txt``/``text`` -> str,
    ``json`` -> the parsed value, images -> PIL images when Pillow is
    installed and ``images="pil"`` (bytes otherwise). Unknown extensions and
    ``__key__`` are kept as they are.
    """
    out = {}
    for name, value in sample.items():
        ext = name.rsplit(".", 1)[-1].lower()
        if name.startswith("__") or not isinstance(value, (bytes, bytearray)):
            out[name] = value
        elif ext in ("cls", "index", "idx", "id"):
            out[name] = int(value.decode().strip())
        elif ext in ("txt", "text"):
            out[name] = value.decode()
        elif ext == "json":
            out[name] = json.loads(value)
        elif ext in IMAGE_EXTS and images == "pil":
            out[name] = _image(value)
        else:
            out[name] = value
    return out


def _image(value):
    try:
        from PIL import Image
    except ImportError:
        return value
    img = Image.open(io.BytesIO(value))
    img.load()
    return img
