"""Client for a Stallfree cache cluster (docs/api.md).

Only the standard library and msgpack are needed; ``stallfree.torch`` adds the
PyTorch dataset, sampler and stall meter.
"""

from .client import Client, NodeUnreachable, StallfreeError
from .decode import decode

__all__ = ["Client", "NodeUnreachable", "StallfreeError", "decode"]
__version__ = "0.1.0"
