"""Pure-PyTorch ground truth: conventional recurrences, ReplaySSM step/flush/verify, quantizers.

Slow and obvious on purpose: the oracle for the kernels, the pool and the engines.
"""

from . import core, gdn, kda, mamba2, quant, replay

FAMILY_MODULES = {"mamba2": mamba2, "gdn": gdn, "kda": kda}

__all__ = ["core", "gdn", "kda", "mamba2", "quant", "replay", "FAMILY_MODULES"]
