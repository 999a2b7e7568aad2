"""Kimi Delta Attention (KDA) ReplaySSM kernels: GDN with a per-channel (per key column) decay.

Per value head: g = -exp(A_log) softplus(a + dt_bias) in R^K, S' = S Diag(exp(g)),
d = beta (v - S' k), S_t = S' + d k^T, o = S_t q. With the records (d_j, k_j, g_j) since the
checkpoint and G = cumulative log-decays: S = S0 Diag(exp(G_c)) + sum_j d_j (k_j * exp(G_c - G_j))^T.
Records: d [H, Dv], k [Hk, Dk], g [H, Dk]. Decode (non-flush + flush rows in one launch),
commit fold (and the whole commit: fold + pointer move) and the conventional baseline.
"""
from .decode import commit, conventional_decode, decode, fold
from .verify import verify

__all__ = ["commit", "conventional_decode", "decode", "fold", "verify"]
