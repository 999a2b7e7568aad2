"""Kimi Delta Attention: Gated DeltaNet with a per-channel decay.

Per value head, with ``g = -exp(A_log) * softplus(a + dt_bias)`` of shape ``[K]`` (one per key channel)::

    S' = S Diag(exp(g));   d = beta * (v - S' k);   S = S' + d k^T;   o = S q

ReplaySSM record per token: ``d [H, V]``, ``k [Hk, K]``, ``g [H, K]``. Inputs as GDN except
``a [.., H, K]`` and ``dt_bias [H, K]``.
"""

from __future__ import annotations

from . import gdn

conventional_step = gdn.conventional_step
conventional_decode = gdn.conventional_decode
decode = gdn.decode
verify = gdn.verify
fold = gdn.fold
commit = gdn.commit
prep = gdn.prep
