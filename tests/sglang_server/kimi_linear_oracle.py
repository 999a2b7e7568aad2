"""An fp64 PyTorch forward of the tiny Kimi-Linear checkpoint (``cpu_harness/tiny_checkpoints.py``), written from the
architecture, independent of SGLang: the oracle of the stock SGLang server's greedy tokens (``transformers`` has no
Kimi-Linear class without remote code). The KDA recurrence is ``sglang_replayssm/reference/kda.py``'s.

Per layer: ``h = x + mixer(rmsnorm(x))``, ``h = h + mlp(rmsnorm(h))``; KDA layers (``linear_attn_config.kda_layers``,
1-based): q/k/v projections through a causal depthwise conv + SiLU, per-channel decay from the low-rank ``f_a``/``f_b``
projection, ``beta = sigmoid(b_proj)``, the delta rule, a gated RMSNorm (``sigmoid(g_b(g_a(x)))``, eps 1e-5 as SGLang's
``KimiDeltaAttention`` builds it), ``o_proj``; the other layers MLA without rotary embedding (``mla_use_nope``): per
head ``q = [q_nope, q_pe]``, keys ``[k_nope, k_pe]`` with ``k_pe`` shared by the heads, ``k_nope`` and ``v`` from
``kv_b_proj(rmsnorm(c))``, scale ``(qk_nope + qk_rope)^-1/2``, causal softmax. The MLP is dense (SwiGLU) in the
first ``first_k_dense_replace`` layers and a sparse MoE block after (``tiny_checkpoints.kimi_moe_layer``): router
scores ``sigmoid(gate(x))``, the ``num_experts_per_token`` experts of the highest ``score + e_score_correction_bias``
(the bias picks, it does not weigh), their scores renormalized to sum 1 and scaled by ``routed_scaling_factor``,
each expert a SwiGLU (``w1`` gate, ``w3`` up, ``w2`` down), plus the shared experts' SwiGLU.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
import torch.nn.functional as F

from sglang_replayssm.cpu_harness.tiny_checkpoints import kimi_moe_layer
from sglang_replayssm.reference import kda as kda_ref


def _rmsnorm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _swiglu(x, gate, up, down):
    return (F.silu(x @ gate.T) * (x @ up.T)) @ down.T


class KimiLinearOracle:
    def __init__(self, model_dir: str | Path):
        from safetensors.torch import load_file

        self.cfg = json.loads((Path(model_dir) / "config.json").read_text())
        self.w = {n: t.double() for n, t in load_file(str(Path(model_dir) / "model.safetensors")).items()}
        self._memo: dict[tuple[int, ...], torch.Tensor] = {}   # the forward is slow: one per token sequence

    def _kda(self, a: str, x: torch.Tensor) -> torch.Tensor:
        w, lin = self.w, self.cfg["linear_attn_config"]
        H, K, W = lin["num_heads"], lin["head_dim"], lin["short_conv_kernel_size"]
        T = x.shape[0]

        def conv(n):   # causal depthwise conv over the tokens, SiLU
            y = x @ w[a + f"{n}_proj.weight"].T                         # [T, P]
            padded = torch.cat([y.new_zeros(W - 1, y.shape[1]), y])
            kern = w[a + f"{n}_conv1d.weight"][:, 0]                    # [P, W]
            return F.silu(torch.stack([(padded[t:t + W] * kern.T).sum(0) for t in range(T)]))

        q, k, v = (conv(n).view(T, H, K) for n in ("q", "k", "v"))
        f = (x @ w[a + "f_a_proj.weight"].T) @ w[a + "f_b_proj.weight"].T   # raw per-channel gates [T, P]
        b = x @ w[a + "b_proj.weight"].T
        S = x.new_zeros(1, H, K, K)
        outs = []
        for t in range(T):
            o, S = kda_ref.conventional_step(S, q[t:t + 1], k[t:t + 1], v[t:t + 1], f[t].view(1, H, K), b[t:t + 1],
                                             w[a + "A_log"].reshape(H), w[a + "dt_bias"].view(H, K))
            outs.append(o[0])
        o = torch.stack(outs)                                           # [T, H, V]
        gate = ((x @ w[a + "g_a_proj.weight"].T) @ w[a + "g_b_proj.weight"].T).view(T, H, K)
        o = _rmsnorm(o, w[a + "o_norm.weight"], 1e-5) * torch.sigmoid(gate)
        return o.reshape(T, H * K) @ w[a + "o_proj.weight"].T

    def _mla(self, a: str, x: torch.Tensor) -> torch.Tensor:
        w, c = self.w, self.cfg
        nh, nope, rope, vd, r = (c["num_attention_heads"], c["qk_nope_head_dim"], c["qk_rope_head_dim"],
                                 c["v_head_dim"], c["kv_lora_rank"])
        T = x.shape[0]
        q = (x @ w[a + "q_proj.weight"].T).view(T, nh, nope + rope)
        latent = x @ w[a + "kv_a_proj_with_mqa.weight"].T
        kv = (_rmsnorm(latent[:, :r], w[a + "kv_a_layernorm.weight"], c["rms_norm_eps"])
              @ w[a + "kv_b_proj.weight"].T).view(T, nh, nope + vd)
        k = torch.cat([kv[..., :nope], latent[:, None, r:].expand(T, nh, rope)], dim=-1)
        scores = torch.einsum("thd,shd->hts", q, k) * (nope + rope) ** -0.5
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        o = torch.einsum("hts,shd->thd", scores.softmax(-1), kv[..., nope:])
        return o.reshape(T, nh * vd) @ w[a + "o_proj.weight"].T

    def _moe(self, m: str, x: torch.Tensor) -> torch.Tensor:
        w, c = self.w, self.cfg
        scores = torch.sigmoid(x @ w[m + "gate.weight"].T)                     # [T, E]
        chosen = (scores + w[m + "gate.e_score_correction_bias"]).topk(c["num_experts_per_token"], dim=-1).indices
        weights = scores.gather(-1, chosen)
        if c.get("moe_renormalize", True):
            weights = weights / weights.sum(-1, keepdim=True)
        weights = weights * c.get("routed_scaling_factor", 1.0)
        out = _swiglu(x, w[m + "shared_experts.gate_proj.weight"], w[m + "shared_experts.up_proj.weight"],
                      w[m + "shared_experts.down_proj.weight"])
        for t in range(x.shape[0]):
            for e, wt in zip(chosen[t].tolist(), weights[t]):
                e_ = f"{m}experts.{e}."
                out[t] += wt * _swiglu(x[t], w[e_ + "w1.weight"], w[e_ + "w3.weight"], w[e_ + "w2.weight"])
        return out

    @torch.no_grad()
    def logprobs(self, ids: list[int]) -> torch.Tensor:
        """Log-probabilities of the next token after every position ``[len(ids), vocab]`` (fp64)."""
        key = tuple(int(i) for i in ids)
        if key not in self._memo:
            self._memo[key] = self._forward(list(key))
        return self._memo[key]

    def _forward(self, ids: list[int]) -> torch.Tensor:
        w, c = self.w, self.cfg
        eps = c["rms_norm_eps"]
        x = w["model.embed_tokens.weight"][torch.tensor(ids)]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = _rmsnorm(x, w[p + "input_layernorm.weight"], eps)
            mixer = self._kda if i + 1 in c["linear_attn_config"]["kda_layers"] else self._mla
            x = x + mixer(p + "self_attn.", h)
            h = _rmsnorm(x, w[p + "post_attention_layernorm.weight"], eps)
            if kimi_moe_layer(c, i):
                x = x + self._moe(p + "block_sparse_moe.", h)
            else:
                x = x + _swiglu(h, w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"],
                                w[p + "mlp.down_proj.weight"])
        x = _rmsnorm(x, w["model.norm.weight"], eps)
        return torch.log_softmax(x @ w["lm_head.weight"].T, dim=-1)


@functools.lru_cache(maxsize=None)
def oracle(model_dir: str) -> KimiLinearOracle:
    return KimiLinearOracle(model_dir)


def disagreement(model_dir: str, ids: list[int], got: list[int], tie_nats: float) -> str | None:
    """None when ``got`` is the oracle's greedy continuation of ``ids`` up to a near tie (< ``tie_nats``, where
    float rounding may pick either token and the continuations part legitimately), else where and by how much not."""
    lp = oracle(model_dir).logprobs(list(ids) + list(got))
    for i, tok in enumerate(got):
        row = lp[len(ids) - 1 + i]
        best = int(row.argmax())
        if tok == best:
            continue
        gap = float(row[best] - row[tok])
        return None if gap < tie_nats else f"token {i}: {tok} where the oracle's greedy token is {best} (by {gap:.3g})"
    return None
