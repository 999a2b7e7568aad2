"""The fused Triton kernels of native/fused.py (under TRITON_INTERPRET=1 on CPU, tests/conftest.py)
against the PyTorch path of native/model.py, kernel by kernel and for whole tiny hybrid models
(fused on vs off: same logits, same greedy tokens, same pool and KV cache contents)."""

import os
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from sglang_replayssm.native import fused
from sglang_replayssm.native.config import embedded_config
from sglang_replayssm.native.blocks import rms_norm, rope, rope_tables
from sglang_replayssm.native.model import ForwardContext, HybridModel, KVCache, random_weights
from sglang_replayssm.native.ssm_ops import SSMOps
from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
                                reason="Triton needs a GPU or TRITON_INTERPRET=1 (tests/conftest.py)")
TOL = dict(rtol=1e-5, atol=1e-5)
# bf16: Triton's interpreter casts fp32 -> bf16 by truncation (the GPU rounds to nearest, as torch does), so
# results with two roundings may differ by two bf16 ulps (2 ** -7 relative) on CPU
BF16 = dict(rtol=2e-2, atol=2e-2)


def gen(seed):
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize("R, N, dtype", [(3, 64, torch.float32), (5, 100, torch.float32), (4, 48, torch.bfloat16)])
def test_add_rms_norm(R, N, dtype):
    g = gen(R * N)
    h, x = torch.randn(R, 2, N, generator=g).to(dtype), torch.randn(R, 2, N, generator=g).to(dtype)
    w = torch.rand(N, generator=g) + 0.5
    h_new, y = fused.add_rms_norm(h, x, w, 1e-5)
    tol = TOL if dtype == torch.float32 else BF16
    if dtype == torch.float32:
        assert torch.equal(h_new, h + x)                   # the residual stream is bit-exact
    torch.testing.assert_close(h_new, h + x, **tol)
    ref = rms_norm(h + x, w, 1e-5)
    torch.testing.assert_close(y, ref, **tol)
    same, y0 = fused.add_rms_norm(h, None, w, 1e-5)        # the first block: no residual
    assert same is h
    torch.testing.assert_close(y0, rms_norm(h, w, 1e-5), **tol)
    with pytest.raises(ValueError, match="weight shape"):
        fused.add_rms_norm(h, x, w[:-1], 1e-5)
    with pytest.raises(ValueError, match="differ"):
        fused.add_rms_norm(h, x[:1], w, 1e-5)


@pytest.mark.parametrize("R, G, N", [(3, 2, 16), (2, 4, 24), (5, 1, 40)])
def test_group_rms_norm(R, G, N):
    g = gen(R + G + N)
    # x and z are strided views of one projection output, as in the model
    proj = torch.randn(R, 2 * G * N + 3, generator=g)
    z, y = proj[:, :G * N].view(R, G, N), proj[:, G * N:2 * G * N].view(R, G, N)
    # Mamba-2: gate before the norm, one weight per channel
    w = torch.rand(G * N, generator=g) + 0.5
    out = fused.group_rms_norm(y, w, 1e-5, z, "before")
    ref = y.float() * F.silu(z.float())
    ref = ref * torch.rsqrt(ref.pow(2).mean(-1, keepdim=True) + 1e-5)
    torch.testing.assert_close(out, (w * ref.reshape(R, G * N)).view(R, G, N), **TOL)
    # GDN: gate after the norm, weight shared by the heads
    wh = torch.rand(N, generator=g) + 0.5
    out = fused.group_rms_norm(y, wh, 1e-6, z, "after")
    torch.testing.assert_close(out, rms_norm(y.float(), wh, 1e-6) * F.silu(z.float()), **TOL)
    torch.testing.assert_close(fused.group_rms_norm(y, wh, 1e-6), rms_norm(y, wh, 1e-6), **TOL)
    with pytest.raises(ValueError, match="z is needed"):
        fused.group_rms_norm(y, wh, 1e-6, None, "after")
    with pytest.raises(ValueError, match="weight has shape"):
        fused.group_rms_norm(y, wh[:-1], 1e-6)


@pytest.mark.parametrize("B, T, H, D, rd, norm", [(2, 1, 4, 16, 8, True), (3, 5, 2, 32, 32, True),
                                                  (2, 3, 3, 16, 0, False), (1, 2, 2, 24, 6, False)])
def test_norm_rope_and_cache_write(B, T, H, D, rd, norm):
    g = gen(B * T * H * D)
    base = torch.randn(B, T, H, 2 * D, generator=g)
    x = base[..., :D]                                                  # strided, like q beside its gate
    pos = torch.randint(0, 20, (B,), generator=g)
    w = torch.rand(D, generator=g) + 0.5 if norm else None
    cos_t, sin_t = rope_tables(40, rd, 10000.0, "cpu")
    positions = pos[:, None] + torch.arange(T)
    ref = rms_norm(x, w, 1e-6) if norm else x
    ref = rope(ref, cos_t[positions], sin_t[positions]) if rd else ref
    out = fused.norm_rope(x, pos, 1e-6, w, cos_t, sin_t, rd)
    torch.testing.assert_close(out, ref, **TOL)
    # the same, written into one layer of a KV cache at (slot, position), as KVCache.write does
    cfg = SimpleNamespace(num_attn_layers=1, num_key_value_heads=H, head_dim=D)
    kv_ref, cache = KVCache(cfg, B + 2, 48, "cpu", torch.float32), torch.zeros(B + 2, 48, H, D)
    slots = torch.randperm(B + 2, generator=g)[:B]
    kv_ref.write(0, slots, pos, ref, ref)
    fused.norm_rope(x, pos, 1e-6, w, cos_t, sin_t, rd, cache=cache, slots=slots.int())
    torch.testing.assert_close(cache, kv_ref.k[0], **TOL)
    with pytest.raises(ValueError, match="rotary_dim"):
        fused.norm_rope(x, pos, rotary_dim=D + 2)
    with pytest.raises(ValueError, match="slots"):
        fused.norm_rope(x, pos, cache=cache)


@pytest.mark.parametrize("act", ["silu", "relu2", "sigmoid"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_act_mul(act, dtype):
    g = gen(7)
    gu = torch.randn(3, 2, 2 * 1100, generator=g).to(dtype)            # > 1 column block, strided halves
    a, b = gu[..., :1100], gu[..., 1100:]
    f = {"silu": F.silu, "relu2": lambda t: torch.relu(t).square(), "sigmoid": torch.sigmoid}[act]
    tol = TOL if dtype == torch.float32 else BF16
    torch.testing.assert_close(fused.act_mul(a, b, act), f(a) * b, **tol)
    torch.testing.assert_close(fused.act_mul(a, None, act), f(a), **tol)
    gate = torch.randn(2, 3, 4, 32, generator=g).to(dtype)[..., :16]     # [B, T, H, D] strided gate
    o = torch.randn(2, 3, 4, 16, generator=g).to(dtype)
    torch.testing.assert_close(fused.act_mul(gate, o, act), f(gate) * o, **tol)
    with pytest.raises(ValueError, match="act must be"):
        fused.act_mul(a, b, "gelu")


def _torch_conv(xc, conv, conv_in, weight, bias, slots, mode):
    """model.HybridModel._conv, the PyTorch path, on a one-layer pool stand-in."""
    K = weight.shape[1]
    this = SimpleNamespace(ssm_index={0: 0}, cfg=SimpleNamespace(conv_kernel=K), fused=False,
                           w={"b0.conv_w": weight, **({"b0.conv_b": bias} if bias is not None else {})})
    ctx = SimpleNamespace(pool=SimpleNamespace(conv=conv[None], conv_in=conv_in[None]))
    return HybridModel._conv(this, 0, xc, slots.long(), slots.int(), mode, ctx, [xc.shape[-1]])[0]


@pytest.mark.parametrize("B, T, C, K, bias", [(3, 1, 40, 4, True), (2, 2, 70, 4, False), (2, 5, 33, 3, True),
                                              (1, 16, 64, 4, False), (2, 3, 20, 2, True)])
@pytest.mark.parametrize("mode", ["decode", "verify"])
def test_conv_update(B, T, C, K, bias, mode):
    g = gen(B * 1000 + T * 100 + C + K)
    S = B + 3
    proj = torch.randn(B, T, C + 5, generator=g)
    xc = proj[..., 2:C + 2]                                            # a strided view, like a split
    weight = torch.randn(C, K, generator=g) / K ** 0.5
    b = torch.randn(C, generator=g) if bias else None
    state, cin = torch.randn(S, C, K - 1, generator=g), torch.randn(S, 16, C, generator=g)
    slots = torch.randperm(S, generator=g)[:B].int()
    st_ref, cin_ref, st_before = state.clone(), cin.clone(), state.clone()
    ref = _torch_conv(xc, st_ref, cin_ref, weight, b, slots, mode)
    out = fused.conv_update(xc, state, weight, b, slots, cin if mode == "verify" else None)
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(state, st_ref, rtol=0, atol=0)          # pure copies: bit-exact
    torch.testing.assert_close(cin, cin_ref, rtol=0, atol=0)
    # the output split into contiguous channel groups (x | B | C, q | k | v) for the SSM kernels
    splits = [C // 2, C - C // 2 - C // 4, C // 4] if C % 3 else [C // 3, C // 3, C // 3]
    state.copy_(st_before)
    parts = fused.conv_update(xc, state, weight, b, slots, cin if mode == "verify" else None, splits)
    assert len(parts) == 3 and all(p.is_contiguous() for p in parts)
    torch.testing.assert_close(torch.cat(parts, -1), ref, **TOL)
    torch.testing.assert_close(state, st_ref, rtol=0, atol=0)
    first, second = fused.conv_update(xc, state.clone(), weight, b, slots, None, [C - 5, 5])
    assert first.shape == (B, T, C - 5) and second.shape == (B, T, 5)


@pytest.mark.parametrize("C, K, bias, block_c, warps", [(40, 4, True, 16, 1), (70, 4, False, 32, 1),
                                                       (33, 3, True, 64, 2), (300, 5, True, 128, 4),
                                                       (300, 2, False, 512, 8)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_conv_update_launch_knobs_change_nothing(C, K, bias, block_c, warps, dtype):
    """block_c / num_warps (bench/conv_update.py's sweep) give the default launch's outputs and new state
    bit for bit, whether the last channel block is partly masked or the block exceeds C; rows of other
    slots (and the padding slot 0) are left alone."""
    g = gen(C * 10 + K)
    B, S = 5, 9
    xc = torch.randn(B, 1, C + 3, generator=g)[..., 1:C + 1].to(dtype)
    weight = (torch.randn(C, K, generator=g) / K ** 0.5).to(dtype)
    b = torch.randn(C, generator=g).to(dtype) if bias else None
    state = torch.randn(S, C, K - 1, generator=g).to(dtype)
    slots = torch.randperm(S - 1, generator=g)[:B].add(1).int()
    runs = []
    for knobs in ({}, dict(block_c=block_c, num_warps=warps)):
        st = state.clone()
        runs.append((fused.conv_update(xc, st, weight, b, slots, None, [C // 3, C - C // 3], **knobs), st))
    for i in range(2):
        torch.testing.assert_close(runs[1][0][i], runs[0][0][i], rtol=0, atol=0)
    torch.testing.assert_close(runs[1][1], runs[0][1], rtol=0, atol=0)
    st_ref = state.clone()
    ref = _torch_conv(xc, st_ref, torch.zeros(S, 1, C, dtype=dtype), weight, b, slots, "decode")
    torch.testing.assert_close(torch.cat(runs[1][0], -1), ref, **(TOL if dtype == torch.float32 else BF16))
    torch.testing.assert_close(runs[1][1], st_ref, rtol=0, atol=0)
    untouched = [s for s in range(S) if s not in slots.tolist()]
    assert torch.equal(runs[1][1][untouched], state[untouched])
    assert not torch.equal(runs[1][1][slots.long()], state[slots.long()])


def test_conv_update_errors():
    x, st, w = torch.zeros(2, 17, 8), torch.zeros(4, 8, 3), torch.zeros(8, 4)
    with pytest.raises(ValueError, match="T=17"):
        fused.conv_update(x, st, w, None, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="state must be"):
        fused.conv_update(x[:, :2], st[:, :, :2], w, None, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="slots must be integers"):
        fused.conv_update(x[:, :2], st, w, None, torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="conv_in must be"):
        fused.conv_update(x[:, :2], st, w, None, torch.tensor([1, 2]), torch.zeros(4, 1, 8))
    with pytest.raises(ValueError, match="splits"):
        fused.conv_update(x[:, :2], st, w, None, torch.tensor([1, 2]), None, [4, 3])
    with pytest.raises(ValueError, match="block_c must be"):
        fused.conv_update(x[:, :1], st, w, None, torch.tensor([1, 2]), block_c=24)
    with pytest.raises(ValueError, match="num_warps must be"):
        fused.conv_update(x[:, :1], st, w, None, torch.tensor([1, 2]), num_warps=3)


# --------------------------------------------------------------------------- whole models
def _state(cfg, model, slots_n, max_drafts):
    geo = SSMGeometry(family=cfg.family, num_heads=cfg.ssm_heads, head_v_dim=cfg.ssm_head_v_dim,
                      head_k_dim=cfg.ssm_head_k_dim, num_k_heads=cfg.ssm_k_heads, conv_dim=cfg.conv_dim,
                      conv_kernel=cfg.conv_kernel)
    pool = ReplayStatePool(geo, cfg.num_ssm_layers, slots_n, ReplayConfig(window=4, max_drafts=max_drafts))
    return ForwardContext(pool, KVCache(cfg, slots_n + 1, 64, "cpu", torch.float32),
                          SSMOps(cfg.family, pool, kernels="reference"))


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_model_fused_equals_torch(family):
    """Prefill (a chunk of 6, then one of 20: the conv beyond 16 tokens falls back), decode steps, a
    verify step and its commit: the same logits, greedy tokens, conv state and KV cache either way."""
    cfg = embedded_config(family)
    weights = random_weights(cfg, seed=3)
    g = gen(11)
    prompt = torch.randint(0, cfg.vocab_size, (2, 26), generator=g)
    drafts = torch.randint(0, cfg.vocab_size, (2, 3), generator=g)
    runs = {}
    for on in (False, True):
        model = HybridModel(cfg, weights, attn_impl="triton", fused=on)
        ctx = _state(cfg, model, 3, 4)
        slots = torch.tensor(ctx.pool.alloc(2))
        logits, toks = [], []
        p0 = model.forward(prompt[:, :6], torch.tensor([0, 0]), slots, "prefill", ctx, 6)
        p1 = model.forward(prompt[:, 6:], torch.tensor([6, 6]), slots, "prefill", ctx, 26)
        logits += [p0, p1]
        tok, pos = p1.argmax(-1, keepdim=True), 26
        for _ in range(3):
            out = model.forward(tok, torch.tensor([pos, pos]), slots, "decode", ctx, pos + 1)
            ctx.pool.advance(slots)
            logits.append(out)
            tok, pos = out[:, -1].argmax(-1, keepdim=True), pos + 1
            toks.append(tok)
        ctx.ops.begin_verify(slots.tolist(), 4)
        ver = model.forward(torch.cat([tok, drafts], 1), torch.tensor([pos, pos]), slots, "verify", ctx, pos + 4)
        ctx.ops.accept_drafts(slots.tolist(), [2, 4])
        logits.append(ver)
        toks.append(ver.argmax(-1))
        runs[on] = (logits, toks, ctx.pool.conv.clone(), ctx.kv.k.clone(), ctx.kv.v.clone())
    (l0, t0, c0, k0, v0), (l1, t1, c1, k1, v1) = runs[False], runs[True]
    for a, b in zip(l0, l1):
        torch.testing.assert_close(b, a, **TOL)
    assert all(torch.equal(a, b) for a, b in zip(t0, t1))
    for a, b in ((c0, c1), (k0, k1), (v0, v1)):
        torch.testing.assert_close(b, a, **TOL)


def test_fused_on_cpu_needs_the_interpreter(monkeypatch):
    cfg = embedded_config("mamba2")
    weights = random_weights(cfg, seed=0)
    assert not HybridModel(cfg, weights).fused                    # default: off on CPU
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="fused=True runs Triton kernels"):
        HybridModel(cfg, weights, fused=True)


def test_merged_projections_keep_input_names():
    """The canonical per-projection names remain the input format; the model holds merged weights."""
    cfg = embedded_config("gdn")
    weights = random_weights(cfg, seed=0)
    model = HybridModel(cfg, weights)
    i = cfg.blocks.index("attention")
    assert torch.equal(model.w[f"b{i}.qkv"], torch.cat([weights[f"b{i}.{n}"] for n in "qkv"]))
    assert f"b{i}.q" not in model.w
    with pytest.raises(ValueError, match="missing parameters"):
        HybridModel(cfg, {k: v for k, v in weights.items() if k != f"b{i}.k"})


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_engine_fused_equals_torch(family):
    """The engine's loop (chunked prefill, ReplaySSM decode, prompt-lookup speculative verify + commit)
    gives the same greedy tokens with the fused kernels as with the PyTorch path."""
    from sglang_replayssm.flags import ReplaySSMOptions
    from sglang_replayssm.native.engine import Engine, EngineArgs, SamplingParams

    outs = {}
    for on in (False, True):
        e = Engine(EngineArgs(model_path=f"embedded:{family}", max_running_requests=2, chunk_size=8,
                              speculative_num_draft_tokens=2, replayssm=ReplaySSMOptions(window=3)))
        e.model.fused = on
        outs[on] = e.generate(["Hello world hello world", "abcdefgabcdefg"], SamplingParams(max_tokens=10))
        assert e.counters["verify_steps"] > 0
    assert outs[True] == outs[False]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logits_fp32(dtype):
    """The LM head in fp32: on CPU (and for fp32 inputs) linear(h, w).float() exactly; on CUDA with bf16 the
    GEMM's fp32 output (torch.mm out_dtype, when this torch has it), within bf16 product rounding of the
    fp32 matmul, and no worse than the rounded path."""
    from sglang_replayssm.native.blocks import linear, logits_fp32
    g = gen(5)
    h = torch.randn(3, 2, 64, generator=g).to(dtype)
    w = torch.randn(300, 64, generator=g).to(dtype)
    out = logits_fp32(h, w)
    assert out.dtype == torch.float32 and out.shape == (3, 2, 300)
    assert torch.equal(out, linear(h, w).float())
    if torch.cuda.is_available() and dtype == torch.bfloat16:
        hc, wc = h.cuda(), w.cuda()
        exact = hc.double() @ wc.double().t()
        got = logits_fp32(hc, wc)
        assert got.dtype == torch.float32 and got.shape == (3, 2, 300)
        assert (got.double() - exact).abs().max() <= (linear(hc, wc).double() - exact).abs().max() + 1e-3
