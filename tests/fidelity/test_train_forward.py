"""tools/tiny_lm.py's batched chunked training forward gives the native engine's logits for the same
weights, after a round trip through the HF format (save_hf -> native.loader.load_model)."""

import pytest
import torch

from sglang_replayssm.native.loader import load_model
from tests.fidelity.helpers import native_teacher_forced_logits
from tools import tiny_lm


def _model(family, seed=1):
    """A micro model whose weights are large enough that every block changes the logits."""
    m = tiny_lm.TinyLM(tiny_lm.hf_config(family, "micro"), seed=seed, chunk=8)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in m.params.items():
            if p.dim() == 2 and not name.startswith("embed"):
                p.mul_(10)
            if name.endswith("norm"):
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return m


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_chunked_forward_matches_native_engine(family, tmp_path):
    m = _model(family)
    tiny_lm.save_hf(tmp_path, m.hf, m.weights())
    cfg, w = load_model(tmp_path)
    assert cfg.family == family and cfg.num_ssm_layers >= 2 and cfg.num_attn_layers == 1
    toks = torch.randint(0, 256, (45,), generator=torch.Generator().manual_seed(0))   # 5 chunks + a partial one
    with torch.no_grad():
        ours = m(toks[None])[0]
    native = native_teacher_forced_logits(cfg, w, toks)
    diff = (ours - native).abs().max()
    # the SSM recurrence matters for these logits: changing one decay moves them far more than our error
    with torch.no_grad():
        name = next(n for n in m.params if n.endswith("A_log"))
        m.params[name].add_(1.0)
        moved = (m(toks[None])[0] - ours).abs().max()
    assert diff < 1e-4 * native.abs().max(), float(diff)
    assert moved > 1e3 * diff, (float(moved), float(diff))


def test_chunk_size_does_not_change_the_result():
    torch.manual_seed(0)
    B, T, H, Dk, Dv = 2, 50, 4, 8, 4
    q, k = torch.randn(B, T, 2, Dk), tiny_lm.l2norm(torch.randn(B, T, 2, Dk))
    v, g, beta = torch.randn(B, T, H, Dv), -torch.rand(B, T, H), torch.rand(B, T, H)
    for b in (None, beta):
        o1, s1 = tiny_lm.chunked_ssm(q, k, v, g, b, chunk=1)     # chunk 1 is the plain recurrence
        o2, s2 = tiny_lm.chunked_ssm(q, k, v, g, b, chunk=16)
        torch.testing.assert_close(o1, o2, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(s1, s2, rtol=1e-4, atol=1e-5)
