"""Pure-PyTorch ground truth: conventional recurrences, ReplaySSM step/flush/verify, quantizers.

Slow and obvious on purpose: the oracle for the kernels, the pool and the engines. Each family module
(``mamba2``, ``gdn``, ``kda``) has the Triton family module's ``decode``, ``verify``,
``conventional_decode`` and ``fold``; ``conv_state`` the conv-state roll. Nothing here imports the pool.
"""

from . import commit_prep, conv_state, core, gdn, kda, mamba2, quant, replay

FAMILY_MODULES = {"mamba2": mamba2, "gdn": gdn, "kda": kda}

__all__ = ["commit_prep", "conv_state", "core", "gdn", "kda", "mamba2", "quant", "replay", "FAMILY_MODULES"]
