"""Drive the native engine's model token by token (teacher-forced) for the fidelity tests."""

import torch

from sglang_replayssm.native.model import ForwardContext, HybridModel, KVCache
from sglang_replayssm.native.ssm_ops import SSMOps
from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry


def native_teacher_forced_logits(cfg, weights, tokens, replay: ReplayConfig | None = None) -> torch.Tensor:
    """Logits [T, V] of the native engine decoding `tokens` (1-D) one by one from an empty state."""
    model = HybridModel(cfg, weights, device="cpu", dtype=torch.float32)
    geo = SSMGeometry(family=cfg.family, num_heads=cfg.ssm_heads, head_v_dim=cfg.ssm_head_v_dim,
                      head_k_dim=cfg.ssm_head_k_dim, num_k_heads=cfg.ssm_k_heads, conv_dim=cfg.conv_dim,
                      conv_kernel=cfg.conv_kernel)
    pool = ReplayStatePool(geo, cfg.num_ssm_layers, 1, replay or ReplayConfig(max_drafts=0))
    T = len(tokens)
    ctx = ForwardContext(pool, KVCache(cfg, 2, T, "cpu", torch.float32), SSMOps(cfg.family, pool))   # CPU: reference
    slots = torch.tensor(pool.alloc(1), dtype=torch.long)
    out = []
    for t in range(T):
        logits = model.forward(tokens[t:t + 1].view(1, 1), torch.tensor([t]), slots, "decode", ctx, t + 1)
        pool.advance(slots)
        out.append(logits[0, 0])
    return torch.stack(out)
