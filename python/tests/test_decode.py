"""stallfree.decode on real JPEGs and PNGs, with Pillow and without it."""

import json
import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from stallfree import decode  # noqa: E402

from images import JPEGS, PNGS, check_decoded_images  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def samples():
    return [{"__key__": f"s{i}", "jpg": JPEGS[i % len(JPEGS)][1], "seg.png": PNGS[i % len(PNGS)][1],
             "cls": b"3", "json": b'{"a": 1}'} for i in range(max(len(JPEGS), len(PNGS)))]


class DecodeTest(unittest.TestCase):
    def test_real_images_decode_by_extension(self):
        # Pillow is a test dependency (python3-pil), so this runs the Pillow
        # path under `make test`; without Pillow it checks the bytes fallback.
        self.assertGreaterEqual(len(JPEGS), 2)
        self.assertGreaterEqual(len(PNGS), 2)
        for s in samples():
            d = decode(s)
            self.assertEqual((d["__key__"], d["cls"], d["json"]), (s["__key__"], 3, {"a": 1}))
            check_decoded_images(self, {"jpg": d["jpg"], "png": d["seg.png"]}, {"jpg": s["jpg"], "png": s["seg.png"]})

    def test_images_none_keeps_bytes(self):
        s = samples()[0]
        self.assertEqual(decode(s, images=None)["jpg"], s["jpg"])

    def test_without_pillow_images_stay_bytes(self):
        # A child process in which importing PIL fails, as on a machine
        # without Pillow: decode still decodes the rest and hands the images
        # over as the bytes they were.
        code = (
            "import json, sys\n"
            "from stallfree import decode\n"
            "from images import JPEGS, PNGS\n"
            "try:\n"
            "    import PIL\n"
            "    print('PIL imported'); sys.exit(3)\n"
            "except ImportError:\n"
            "    pass\n"
            "d = decode({'__key__': 'k', 'jpg': JPEGS[0][1], 'x.png': PNGS[0][1], 'cls': b'7'})\n"
            "print(json.dumps([d['jpg'] == JPEGS[0][1], d['x.png'] == PNGS[0][1], d['cls']]))\n"
        )
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(HERE, "no_pillow"),
                                                           os.path.join(HERE, ".."), HERE]))
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        self.assertEqual(json.loads(out.stdout), [True, True, 7])


if __name__ == "__main__":
    unittest.main()
