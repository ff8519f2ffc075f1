"""A counter-based generator of per-sample random numbers (splitmix64),
keyed by (seed, epoch, sample index, stream): the same draws for a sample
wherever it sits in a batch, in every job and after a resume. Needs numpy
only; ``stallfree.torch.augment`` draws its parameters from it.
"""

import numpy as np

__all__ = ["uniform"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(z):
    """splitmix64's finaliser on a uint64 array (wrapping arithmetic)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def uniform(seed, epoch, indices, stream, draws):
    """``(len(indices), draws)`` floats in [0, 1): draw j of sample index i
    under (seed, epoch, stream), a pure function of those five numbers."""
    idx = np.asarray(indices, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        key = _mix(np.array([int(seed) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) + _GOLDEN)
        key = _mix(key ^ (np.uint64(int(epoch) & 0xFFFFFFFFFFFFFFFF) * _GOLDEN))
        key = _mix(key ^ (np.uint64(int(stream) & 0xFFFFFFFF) + _GOLDEN))
        per_sample = _mix(key ^ _mix(idx + _GOLDEN))
        counters = (np.arange(1, draws + 1, dtype=np.uint64) * _GOLDEN)[None, :]
        bits = _mix(per_sample[:, None] + counters)
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
