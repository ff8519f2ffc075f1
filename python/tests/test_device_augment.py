"""stallfree.torch.augment: the drawn parameters' ranges and statistics,
determinism per (seed, epoch, index), and the kernels' arithmetic."""

import math
import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

try:
    import numpy as np
    import torch
    import torchvision  # noqa: F401
    from stallfree.torch import augment as A
except ImportError:  # pragma: no cover - the device path needs torch and torchvision
    torch = None


def images(indices, h=40, w=56):
    """A (B, H, W, 3) uint8 batch whose sample k is a pure function of
    indices[k], so a sample can be compared across batches."""
    out = []
    for i in indices:
        g = torch.Generator().manual_seed(int(i))
        out.append(torch.randint(0, 256, (h, w, 3), dtype=torch.uint8, generator=g))
    return torch.stack(out)


@unittest.skipIf(torch is None, "torch and torchvision are not installed")
class CropParameterTest(unittest.TestCase):
    def test_scale_and_ratio_within_bounds_and_covering_them(self):
        crop = A.RandomResizedCrop(224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3))
        n, H, W = 20000, 1000, 1000
        b = crop.boxes([(H, W)] * n, np.arange(n), epoch=0, seed=1)
        w, h = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
        self.assertTrue(((b[:, 0] >= 0) & (b[:, 1] >= 0) & (b[:, 2] <= W) & (b[:, 3] <= H)).all(), "inside the image")
        self.assertTrue((b == np.rint(b)).all(), "whole pixels, as torchvision's")
        scale, ratio = w * h / (H * W), w / h
        # Rounding w and h to pixels moves the area and ratio by < 0.5%.
        self.assertGreaterEqual(scale.min(), 0.08 * 0.99)
        self.assertLessEqual(scale.max(), 1.0)
        self.assertGreaterEqual(ratio.min(), 0.75 * 0.99)
        self.assertLessEqual(ratio.max(), 4 / 3 * 1.01)
        self.assertLess(scale.min(), 0.085)
        self.assertGreater(scale.max(), 0.99)
        self.assertLess(ratio.min(), 0.76)
        self.assertGreater(ratio.max(), 1.32)
        # log(ratio) is drawn uniformly: its deciles are evenly spaced.
        lr = (np.log(ratio) - math.log(3 / 4)) / (math.log(4 / 3) - math.log(3 / 4))
        np.testing.assert_allclose(np.quantile(lr, [0.1, 0.5, 0.9]), [0.1, 0.5, 0.9], atol=0.03)

    def test_statistics_match_torchvisions_sampler(self):
        from torchvision.transforms import RandomResizedCrop as TV
        n, H, W = 4000, 300, 500
        img = torch.zeros(3, H, W)
        torch.manual_seed(0)
        ref = np.array([TV.get_params(img, [0.08, 1.0], [3 / 4, 4 / 3]) for _ in range(n)], dtype=np.float64)
        b = A.RandomResizedCrop(224).boxes([(H, W)] * n, np.arange(n), epoch=0, seed=7)
        ours = {"scale": (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1]) / (H * W), "ratio": (b[:, 2] - b[:, 0]) / (b[:, 3] - b[:, 1]),
                "top": b[:, 1] / H, "left": b[:, 0] / W}
        theirs = {"scale": ref[:, 2] * ref[:, 3] / (H * W), "ratio": ref[:, 3] / ref[:, 2],
                  "top": ref[:, 0] / H, "left": ref[:, 1] / W}
        for k in ours:  # means within ~4 standard errors
            se = math.sqrt(ours[k].var() / n + theirs[k].var() / n)
            self.assertLess(abs(ours[k].mean() - theirs[k].mean()), 4 * se, k)

    def test_fallback_is_torchvisions_central_crop(self):
        from torchvision.transforms import RandomResizedCrop as TV
        H, W = 10, 1000  # no try can fit: a ratio-clamped central crop
        i, j, h, w = TV.get_params(torch.zeros(3, H, W), [0.08, 1.0], [3 / 4, 4 / 3])
        b = A.RandomResizedCrop(8).boxes([(H, W)] * 5, np.arange(5), epoch=3, seed=3)
        self.assertEqual(b.tolist(), [[j, i, j + w, i + h]] * 5)


@unittest.skipIf(torch is None, "torch and torchvision are not installed")
class FlipTest(unittest.TestCase):
    def test_flip_rate_is_p(self):
        for p in (0.0, 0.3, 0.5, 1.0):
            n = 10000
            k = int(A.RandomHorizontalFlip(p).flips(np.arange(n), epoch=2, seed=5).sum())
            sigma = math.sqrt(n * p * (1 - p))
            self.assertLessEqual(abs(k - n * p), 4 * sigma + 1e-9, f"p={p}: {k} of {n} flipped")

    def test_flip_mirrors_the_chosen_samples_only(self):
        x = images(range(16))
        flip = A.RandomHorizontalFlip(0.5)
        out = flip(x, np.arange(16), epoch=0, seed=0)
        chosen = flip.flips(np.arange(16), epoch=0, seed=0)
        self.assertTrue(0 < chosen.sum() < 16)
        ref = x.permute(0, 3, 1, 2).float() / 255
        for k in range(16):
            want = ref[k].flip(-1) if chosen[k] else ref[k]
            self.assertTrue(torch.equal(out[k], want), k)
        given = ref.clone()
        self.assertTrue(torch.equal(flip(given, np.arange(16), epoch=0, seed=0), out))
        self.assertTrue(torch.equal(given, ref), "the caller's tensor is left as it was")


@unittest.skipIf(torch is None, "torch and torchvision are not installed")
class DeterminismTest(unittest.TestCase):
    aug = None

    def setUp(self):
        self.aug = A.Compose([A.RandomResizedCrop(24), A.RandomHorizontalFlip(),
                              A.Normalize([0.5, 0.4, 0.3], [0.2, 0.25, 0.3])])

    def test_same_index_same_output_in_any_batch(self):
        first = self.aug(images(range(12)), np.arange(12), epoch=4, seed=9)
        other = [30, 7, 3, 11]
        again = self.aug(images(other), np.array(other), epoch=4, seed=9)
        for pos, i in enumerate(other[1:], 1):
            torch.testing.assert_close(again[pos], first[i], rtol=0, atol=1e-6)

    def test_epoch_and_seed_change_the_draws(self):
        idx = np.arange(32)
        x = images(idx)
        base = self.aug(x, idx, epoch=0, seed=0)
        for kw in ({"epoch": 1, "seed": 0}, {"epoch": 0, "seed": 1}):
            other = self.aug(x, idx, **kw)
            same = sum(torch.equal(base[k], other[k]) for k in range(32))
            self.assertLessEqual(same, 1, kw)
        self.assertTrue(torch.equal(base, self.aug(x, idx, epoch=0, seed=0)), "a pure function")

    def test_positions_in_compose_draw_independently(self):
        idx = np.arange(4000)
        a = A.uniform(0, 0, idx, 1, 1)[:, 0]
        b = A.uniform(0, 0, idx, 2, 1)[:, 0]
        self.assertLess(abs(np.corrcoef(a, b)[0, 1]), 0.08)


@unittest.skipIf(torch is None, "torch and torchvision are not installed")
class KernelTest(unittest.TestCase):
    def test_output_shape_dtype_and_memory_format(self):
        x = images(range(5))
        for dtype in (torch.float32, torch.bfloat16):
            out = A.Compose([A.RandomResizedCrop((20, 30)), A.RandomHorizontalFlip()], dtype=dtype)(x, np.arange(5))
            self.assertEqual(tuple(out.shape), (5, 3, 20, 30))
            self.assertEqual(out.dtype, dtype)
            self.assertTrue(out.is_contiguous(memory_format=torch.channels_last))

    def test_normalize(self):
        x = images(range(3))
        mean, std = [0.1, 0.5, 0.9], [0.5, 0.25, 0.125]
        out = A.Normalize(mean, std)(x, np.arange(3))
        want = (x.permute(0, 3, 1, 2).double() / 255 - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
        torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-5)

    def whole(self, size, h, w):
        """A crop that always takes the whole image."""
        return A.RandomResizedCrop(size, scale=(1.0, 1.0), ratio=(w / h, w / h))

    def test_whole_image_crop_is_a_plain_resize(self):
        f = torch.nn.functional
        x = images(range(4), 32, 32)
        ref = x.permute(0, 3, 1, 2).float() / 255
        up = self.whole(48, 32, 32)(x, np.arange(4))
        torch.testing.assert_close(up, f.interpolate(ref, size=(48, 48), mode="bilinear", align_corners=False),
                                   rtol=0, atol=1e-5)
        down = self.whole(16, 32, 32)(x, np.arange(4))
        torch.testing.assert_close(down, f.avg_pool2d(ref, 2), rtol=0, atol=1e-5)
        same = self.whole(32, 32, 32)(x, np.arange(4))
        torch.testing.assert_close(same, ref, rtol=0, atol=1e-6)

    def test_images_of_different_sizes_crop_as_each_alone(self):
        crop = A.RandomResizedCrop(16)
        sizes = [(20, 30), (33, 17), (24, 24)]
        imgs = [images([k], h, w)[0].permute(2, 0, 1).contiguous() for k, (h, w) in enumerate(sizes)]
        together = crop(imgs, np.array([5, 6, 7]), epoch=1, seed=2)
        for k, img in enumerate(imgs):
            alone = crop(img.permute(1, 2, 0)[None], np.array([5 + k]), epoch=1, seed=2)
            torch.testing.assert_close(together[k], alone[0], rtol=0, atol=1e-6)

    @unittest.skipUnless(torch is not None and torch.cuda.is_available(), "no CUDA device")
    def test_cuda_matches_cpu(self):
        aug = A.Compose([A.RandomResizedCrop(24), A.RandomHorizontalFlip(), A.Normalize([0.5] * 3, [0.25] * 3)])
        x, idx = images(range(32)), np.arange(32)
        torch.testing.assert_close(aug(x.cuda(), idx, epoch=1, seed=1).cpu(), aug(x, idx, epoch=1, seed=1),
                                   rtol=0, atol=1e-4)


if __name__ == "__main__":
    unittest.main()
