"""Engine-agnostic ReplaySSM state pool: checkpoints, read copies, record rings, cursors, slots."""

from .config import CKPT_PRECISIONS, FAMILIES, READ_COPIES, ReplayConfig, SSMGeometry
from .errors import (BadSlotError, CommitError, ConfigError, DoubleFreeError, DraftOverflowError,
                     PoolError, PoolExhaustedError)
from .pool import ReplayStatePool, SlotAllocator

__all__ = [
    "CKPT_PRECISIONS", "FAMILIES", "READ_COPIES", "ReplayConfig", "SSMGeometry",
    "BadSlotError", "CommitError", "ConfigError", "DoubleFreeError", "DraftOverflowError", "PoolError",
    "PoolExhaustedError", "ReplayStatePool", "SlotAllocator",
]
