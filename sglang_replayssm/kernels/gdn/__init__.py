"""Gated DeltaNet (GDN) ReplaySSM kernels: decode (non-flush + flush rows in one launch),
output-only verify (chain + tree), commit fold (and the whole commit: fold + pointer move), and the
conventional decode baseline.

Layout and math: docs/layout.md. Per value head h (k-head h // (H // Hk)):
  g = -exp(A_log) softplus(a + dt_bias), alpha = exp(g), beta = sigmoid(b),
  S' = alpha S, d = beta (v - S' k), S_t = S' + d k^T, o = S_t q  (q, k L2-normalised, q scaled).
A non-flush step reads the checkpoint (or its read copy) once, replays the records for S q and
S k only (vectors, no state tile), writes the output and one record (d, k, g).
"""
from .decode import commit, conventional_decode, decode, fold
from .verify import verify

__all__ = ["commit", "conventional_decode", "decode", "fold", "verify"]
