"""Client for a Stallfree cache cluster (DESIGN §6).

Only the standard library and msgpack are needed; ``stallfree.torch`` adds the
PyTorch dataset, sampler and stall meter.
"""

from .client import Client, StallfreeError

__all__ = ["Client", "StallfreeError"]
__version__ = "0.1.0"
