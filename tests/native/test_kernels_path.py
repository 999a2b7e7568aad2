"""The engine's Triton path (what runs on CUDA), here under TRITON_INTERPRET=1 (tests/conftest.py):
same greedy tokens as the reference path, for ReplaySSM decode, speculative verify and the
conventional baseline."""

import os

import pytest

from sglang_replayssm.flags import ReplaySSMOptions
from sglang_replayssm.native.engine import Engine, EngineArgs, SamplingParams

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="Triton on CPU needs TRITON_INTERPRET=1 before triton is imported")
PROMPTS = ["Hello world hello world", "abcdefgabcdefg"]


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("opts, k", [(dict(window=3), 2), (dict(decode=False), 0)],
                         ids=["replay-decode-and-spec", "conventional"])
def test_triton_path_equals_reference(family, opts, k):
    outs = {}
    for kernels in ("reference", "triton"):
        e = Engine(EngineArgs(model_path=f"embedded:{family}", max_running_requests=2, kernels=kernels,
                              speculative_num_draft_tokens=k, replayssm=ReplaySSMOptions(**opts)))
        outs[kernels] = e.generate(PROMPTS, SamplingParams(max_tokens=8))
        if kernels == "triton":
            assert e.ops.backend == "triton"
    assert outs["triton"] == outs["reference"]


def test_ssm_ops_kernel_options_reach_the_kernels_and_are_checked():
    """SSMOps passes decode/verify options to the Triton wrappers (here GDN's split verify and a
    pipelined decode), with the reference's results; an option the wrapper lacks is a clear error."""
    import torch

    from sglang_replayssm.kernels.tuning import KernelTuning
    from sglang_replayssm.native.ssm_ops import SSMOps
    from sglang_replayssm.pool import ReplayConfig, ReplayStatePool, SSMGeometry

    H, Hk, Dv, Dk, B, T = 4, 2, 16, 16, 3, 3
    geo = SSMGeometry(family="gdn", num_heads=H, head_v_dim=Dv, head_k_dim=Dk, num_k_heads=Hk)
    outs = {}
    for kernels in ("reference", "triton"):
        pool = ReplayStatePool(geo, 1, B, ReplayConfig(window=4, max_drafts=T), device="cpu")
        pool.ckpt.copy_(torch.randn(pool.ckpt.shape, generator=torch.Generator().manual_seed(1)) * 0.1)
        slots = torch.tensor(pool.alloc(B), dtype=torch.int32)
        pipelined = {"tuning": KernelTuning(stages=2)}
        ops = SSMOps("gdn", pool, kernels=kernels, decode_options=pipelined if kernels == "triton" else None,
                     verify_options={"method": "split"} if kernels == "triton" else None)
        if kernels == "triton":
            assert ops.verify_kw == {"method": "split"} and ops.decode_kw == pipelined
        gen = torch.Generator().manual_seed(5)
        r = lambda *s: torch.randn(*s, generator=gen)   # noqa: E731
        res = []
        for _ in range(2):   # two decode steps, then a verify of T drafts
            inp = (r(B, 1, Hk, Dk), r(B, 1, Hk, Dk), r(B, 1, H, Dv), r(B, 1, H), r(B, 1, H), r(H) * 0.3, r(H) * 0.3)
            res.append(ops.run(0, slots, "decode", inp, 1))
            pool.advance(slots.long())
        inp = (r(B, T, Hk, Dk), r(B, T, Hk, Dk), r(B, T, H, Dv), r(B, T, H), r(B, T, H), r(H) * 0.3, r(H) * 0.3)
        ops.begin_verify(slots.tolist(), T)
        res.append(ops.run(0, slots, "verify", inp, T))
        outs[kernels] = res
    for a, b in zip(outs["triton"], outs["reference"]):
        torch.testing.assert_close(a.float(), b.float(), rtol=5e-4, atol=5e-5)
    pool = ReplayStatePool(geo, 1, B, ReplayConfig(window=4, max_drafts=T), device="cpu")
    with pytest.raises(ValueError, match=r"verify options \['methd'\] are not accepted"):
        SSMOps("gdn", pool, kernels="triton", verify_options={"methd": "split"})


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
def test_a_decode_step_builds_its_flush_list_once_for_all_layers(family):
    """Inside SSMOps.forward_scope (model.forward wraps every forward in it) a ReplaySSM decode step on the
    kernels builds the split decode's flush-row list once and every SSM layer's split decode takes it: the
    same tokens as the reference engine over several windows (rows flushing at different steps), one list
    per decode forward, handed to each of its SSM layers. With the fused decode (the plan at small batches)
    no list is built at all."""
    import dataclasses

    outs, calls, handed = {}, [], []
    for kernels in ("reference", "triton", "fused"):
        e = Engine(EngineArgs(model_path=f"embedded:{family}", max_running_requests=3,
                              kernels="reference" if kernels == "reference" else "triton",
                              replayssm=ReplaySSMOptions(window=3)))
        fops = e.ops.family_ops
        if kernels == "fused":
            build = fops.flush_list
            e.ops.family_ops = dataclasses.replace(
                fops, flush_list=lambda *a: pytest.fail("a fused decode step built a flush list") or build(*a))
        if kernels == "triton":
            assert fops.flush_list is not None
            e.ops.decode_kw = {"method": "split"}
            build, decode = fops.flush_list, fops.decode
            e.ops.family_ops = dataclasses.replace(
                fops, flush_list=lambda *a: calls.append(1) or build(*a),
                decode=lambda *a, **kw: handed.append(kw.get("flush_list")) or decode(*a, **kw))
        outs[kernels] = e.generate(PROMPTS + ["xyz"], SamplingParams(max_tokens=9))
    assert outs["triton"] == outs["reference"] == outs["fused"]
    assert len(calls) >= 8 and len(handed) == len(calls) * e.cfg.num_ssm_layers
    assert all(h is not None and int(h()[1]) <= 3 for h in handed)
