"""Batched augmentation on the device: ``RandomResizedCrop``,
``RandomHorizontalFlip``, ``Normalize`` and ``Compose`` (docs/device.md).

Every transform takes a whole batch and the batch's sample indices::

    aug = Compose([RandomResizedCrop(224), RandomHorizontalFlip(), Normalize(MEAN, STD)],
                  dtype=torch.bfloat16)
    x = aug(batch, indices, epoch=e, seed=s)  # (B, C, 224, 224), channels_last

Input: a uint8 tensor ``(B, H, W, C)`` (channels last, as numpy and PIL lay
out images and as the prep cache stores them), a ``(B, C, H, W)`` float
tensor in [0, 1] (what a transform hands the next), or a list of ``(C, H, W)``
uint8 tensors of different sizes (``torchvision.io.decode_jpeg``'s output).
uint8 becomes float in [0, 1] first, as torchvision's ``ToTensor`` does.
``Compose``'s output: ``(B, C, h, w)`` of its dtype in ``torch.channels_last``
memory format. ``apply`` (what Compose calls) may work in place on the
tensors it is given; calling a transform never changes the caller's input.

Each sample's parameters are drawn from a counter-based generator keyed by
(seed, epoch, index, the transform's position in its Compose), computed in
numpy on the CPU: a sample gets the same crop and flip wherever it sits in
a batch, on CPU and CUDA alike, in every job and after a resume. The work is
a few batched kernels whatever the batch size: one ``roi_align`` crops and
resizes every sample, one indexed copy mirrors the samples drawn to flip.
"""

import math

import numpy as np
import torch
from torchvision.ops import roi_align

from ..seeded import _GOLDEN, _mix, uniform  # noqa: F401 - augment.uniform is public

__all__ = ["Compose", "RandomResizedCrop", "RandomHorizontalFlip", "Normalize", "uniform"]


def _as_float(x):
    """A float (B, C, H, W) tensor, or for a list, a list of float (C, H, W)."""
    if isinstance(x, (list, tuple)):
        return [t.float().div_(255) if t.dtype == torch.uint8 else t for t in x]
    if x.dtype == torch.uint8:
        if x.dim() == 3:  # (B, H, W): grey
            x = x.unsqueeze(-1)
        # Contiguous (B, C, H, W) in the same pass as the conversion:
        # roi_align's kernels work on that layout (they copy anything else).
        return x.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format).div_(255)
    return x


def _to(t, device):
    """A small CPU tensor (boxes, indices) on device without waiting: a
    blocking copy would wait for the work queued on the device (the training
    step) before the augmentation could be queued behind it."""
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def _owned(x):
    """_as_float(x), never the caller's own tensor: ``apply`` may work in place."""
    y = _as_float(x)
    if isinstance(x, (list, tuple)):
        return [b.clone() if b is a else b for a, b in zip(x, y)]
    return y.clone() if y is x else y


def _sizes(x):
    """[(h, w)] of each sample."""
    if isinstance(x, (list, tuple)):
        return [(int(t.shape[-2]), int(t.shape[-1])) for t in x]
    return [(int(x.shape[-2]), int(x.shape[-1]))] * int(x.shape[0])


class _Transform:
    """Callable as ``t(x, indices, epoch=0, seed=0)``; Compose tells each
    transform its position (``stream``) so that two in one pipeline draw
    independent parameters."""

    stream = 0

    def __call__(self, x, indices, epoch=0, seed=0):
        return self.apply(_owned(x), indices, epoch, seed, self.stream)


class RandomResizedCrop(_Transform):
    """torchvision's ``RandomResizedCrop`` per sample, batched: a box of
    ``scale`` of the area and aspect ratio in ``ratio`` (log-uniform), up to
    10 tries, else the central crop of the nearest allowed ratio; resized to
    ``size`` with ``roi_align`` (bilinear; ``sampling_ratio=0`` averages
    ceil(box/size) samples per output pixel, so shrinking is antialiased and
    enlarging is plain bilinear)."""

    tries = 10

    def __init__(self, size, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), sampling_ratio=0):
        self.size = (int(size), int(size)) if isinstance(size, (int, np.integer)) else tuple(int(s) for s in size)
        if not (0 < scale[0] <= scale[1]) or not (0 < ratio[0] <= ratio[1]):
            raise ValueError(f"scale={scale!r}, ratio={ratio!r}: want 0 < low <= high")
        self.scale, self.ratio, self.sampling_ratio = tuple(scale), tuple(ratio), int(sampling_ratio)

    def boxes(self, sizes, indices, epoch, seed, stream=0):
        """``(B, 4)`` float64 boxes ``(x0, y0, x1, y1)`` in pixel edges, one
        per sample of size ``sizes[k] = (h, w)``."""
        hw = np.asarray(sizes, dtype=np.float64).reshape(-1, 2)
        H, W = hw[:, :1], hw[:, 1:]  # (B, 1): broadcast over the tries
        u = uniform(seed, epoch, indices, stream, 4 * self.tries).reshape(-1, self.tries, 4)
        area = H * W * (self.scale[0] + u[..., 0] * (self.scale[1] - self.scale[0]))
        lo, hi = math.log(self.ratio[0]), math.log(self.ratio[1])
        aspect = np.exp(lo + u[..., 1] * (hi - lo))
        w = np.rint(np.sqrt(area * aspect))
        h = np.rint(np.sqrt(area / aspect))
        ok = (w > 0) & (w <= W) & (h > 0) & (h <= H)
        top = np.floor(u[..., 2] * (H - h + 1))
        left = np.floor(u[..., 3] * (W - w + 1))
        first = ok.argmax(axis=1)  # the first try that fits, as torchvision's loop takes
        rows = np.arange(len(first))
        w, h, top, left = w[rows, first], h[rows, first], top[rows, first], left[rows, first]
        # None fits: the central crop, its ratio clamped into the range.
        H, W = H[:, 0], W[:, 0]
        in_ratio = W / H
        fw = np.where(in_ratio < self.ratio[0], W, np.where(in_ratio > self.ratio[1], np.rint(H * self.ratio[1]), W))
        fh = np.where(in_ratio < self.ratio[0], np.rint(W / self.ratio[0]), H)
        fit = ok.any(axis=1)
        w, h = np.where(fit, w, fw), np.where(fit, h, fh)
        top = np.where(fit, top, (H - h) // 2)
        left = np.where(fit, left, (W - w) // 2)
        return np.stack([left, top, left + w, top + h], axis=1)

    def apply(self, x, indices, epoch, seed, stream):
        sizes = _sizes(x)
        boxes = torch.from_numpy(self.boxes(sizes, indices, epoch, seed, stream))
        if isinstance(x, (list, tuple)):
            x = _pad_batch(x, sizes)
        rois = torch.cat([torch.arange(len(boxes), dtype=torch.float64)[:, None], boxes], dim=1)
        rois = _to(rois.to(x.dtype), x.device)
        return roi_align(x, rois, output_size=self.size, spatial_scale=1.0,
                         sampling_ratio=self.sampling_ratio, aligned=True)


def _pad_batch(images, sizes):
    """One (B, C, Hmax, Wmax) tensor of differently sized images. The padding
    repeats each image's last row and column, so that the bilinear taps a box
    at the image's edge takes read what clamping at the edge would."""
    hmax, wmax = max(h for h, _ in sizes), max(w for _, w in sizes)
    out = []
    for t, (h, w) in zip(images, sizes):
        if (h, w) != (hmax, wmax):
            t = torch.nn.functional.pad(t[None], (0, wmax - w, 0, hmax - h), mode="replicate")[0]
        out.append(t)
    return torch.stack(out)


class RandomHorizontalFlip(_Transform):
    """Mirrors each sample left-right with probability ``p``."""

    def __init__(self, p=0.5):
        self.p = float(p)

    def flips(self, indices, epoch, seed, stream=0):
        """A bool per sample: whether it is flipped."""
        return uniform(seed, epoch, indices, stream, 1)[:, 0] < self.p

    def apply(self, x, indices, epoch, seed, stream):
        if isinstance(x, (list, tuple)):
            x = _pad_batch(x, _sizes(x)) if len({tuple(t.shape) for t in x}) > 1 else torch.stack(list(x))
        chosen = _to(torch.from_numpy(np.flatnonzero(self.flips(indices, epoch, seed, stream))), x.device)
        x[chosen] = x[chosen].flip(-1)  # in place: only the chosen samples move
        return x


class Normalize(_Transform):
    """``(x - mean) / std`` per channel (x in [0, 1], as torchvision's)."""

    def __init__(self, mean, std):
        self.mean = torch.as_tensor(mean, dtype=torch.float32).reshape(1, -1, 1, 1)
        self.std = torch.as_tensor(std, dtype=torch.float32).reshape(1, -1, 1, 1)
        if bool((self.std == 0).any()):
            raise ValueError("Normalize: std must not be 0")
        self._on = {}  # (device, dtype) -> (scale, shift) there: copied once, not per batch

    def apply(self, x, indices, epoch, seed, stream):
        if isinstance(x, (list, tuple)):
            return [self.apply(t[None], indices, epoch, seed, stream)[0] for t in x]
        key = (x.device, x.dtype)
        if key not in self._on:
            self._on[key] = ((1 / self.std).to(device=x.device, dtype=x.dtype),
                             (-self.mean / self.std).to(device=x.device, dtype=x.dtype))
        scale, shift = self._on[key]
        return torch.addcmul(shift, x, scale)  # x * (1/std) - mean/std in one pass


class Compose(_Transform):
    """The transforms in order, each with its own parameter stream; the
    result as ``dtype`` (float32 by default; e.g. ``torch.bfloat16``) in
    channels_last memory format."""

    def __init__(self, transforms, dtype=torch.float32):
        self.transforms, self.dtype = list(transforms), dtype

    def apply(self, x, indices, epoch, seed, stream):
        for pos, t in enumerate(self.transforms):
            x = t.apply(_as_float(x), indices, epoch, seed, stream * 64 + pos + 1)  # x is already owned
        if isinstance(x, (list, tuple)):
            x = _pad_batch(x, _sizes(x)) if len({tuple(t.shape) for t in x}) > 1 else torch.stack(list(x))
        return x.to(self.dtype).contiguous(memory_format=torch.channels_last)
