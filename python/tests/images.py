"""Real images for the decode path: a few small JPEGs and PNGs written by
Pillow, committed in python/tests/images so that the tests have the same data
with and without Pillow installed."""

import io
import os

DIR = os.path.join(os.path.dirname(__file__), "images")


def _load(ext):
    out = []
    for name in sorted(os.listdir(DIR)):
        if name.endswith("." + ext):
            with open(os.path.join(DIR, name), "rb") as f:
                out.append((name, f.read()))
    return out


JPEGS = _load("jpg")
PNGS = _load("png")


def have_pillow():
    try:
        import PIL.Image  # noqa: F401
    except ImportError:
        return False
    return True


def check_decoded_images(case, decoded, raw):
    """Asserts what stallfree.decode made of raw's image parts: with Pillow,
    images of the committed files' size and pixels; without it, the bytes
    unchanged."""
    for ext in ("jpg", "png"):
        if ext not in raw:
            continue
        got = decoded[ext]
        if not have_pillow():
            case.assertEqual(got, raw[ext], f"{ext} without Pillow: the bytes as they are")
            continue
        from PIL import Image
        want = Image.open(io.BytesIO(raw[ext]))
        want.load()
        case.assertIsInstance(got, Image.Image, f"{ext} with Pillow")
        case.assertEqual((got.format, got.size, got.mode), (want.format, want.size, want.mode))
        case.assertEqual(got.tobytes(), want.tobytes())
