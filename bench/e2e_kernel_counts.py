"""Device kernels per forward of the native engine's hybrid models, no timing: one decode forward (T = 1) and
one verify forward (T = 5) of tiny copies of bench/e2e.py's model shapes, the fused non-SSM kernels off and on,
counted on CPU (Triton under its interpreter, each launch marked). The SSM kernels themselves are stubbed and
counted apart; SSMOps' preparation of their inputs is counted.

  python bench/e2e_kernel_counts.py [--models nemotron-3-nano-4b qwen3.5-4b] [--out PATH]
      -> bench/results/e2e_kernel_counts.json
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")   # before Triton is imported: the launches run (and are counted) on CPU

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

from e2e import ROOT, make_state, model_config  # noqa: E402
from sglang_replayssm.native.config import HybridConfig  # noqa: E402
from sglang_replayssm.native.model import HybridModel, random_weights  # noqa: E402

# aten ops that never launch a device kernel (views, metadata, allocation) or only through a child op
NO_KERNEL = {"empty", "empty_strided", "empty_like", "view", "_reshape_alias", "_unsafe_view", "as_strided", "reshape",
             "resolve_conj", "resolve_neg", "t", "transpose", "permute", "unsqueeze", "squeeze", "expand", "slice",
             "select", "split", "split_with_sizes", "chunk", "narrow", "unfold", "flatten", "detach", "alias",
             "resize_", "lift_fresh", "to", "_to_copy", "contiguous", "linear", "matmul", "clone", "zeros_like",
             "unbind", "view_as", "expand_as", "result_type", "_has_compatible_shallow_copy_type", "detach_"}


def tiny_copy(cfg: HybridConfig) -> HybridConfig:
    """The same blocks and options (gates, norms, RoPE, GQA ratio, tied embeddings) at toy dimensions:
    the kernel count of a step depends on the structure, not on the sizes."""
    G = cfg.num_attention_heads // cfg.num_key_value_heads
    head_dim = 16
    return dataclasses.replace(cfg, vocab_size=512, hidden_size=64, num_key_value_heads=2,
                               num_attention_heads=2 * G, head_dim=head_dim,
                               rotary_dim=cfg.rotary_dim * head_dim // cfg.head_dim, intermediate_size=96,
                               ssm_heads=2 * cfg.ssm_heads // cfg.ssm_k_heads, ssm_k_heads=2, ssm_head_v_dim=8,
                               ssm_head_k_dim=16).validate()


def stub_ssm_kernels(ops, family: str):
    """Replace the SSM kernels of an SSMOps by one marked region each returning zeros (counted apart), so
    that a count covers everything else, including the inputs SSMOps prepares for them."""
    out_like = 0 if family == "mamba2" else 2   # x [.., H, P] / v [.., H, Dv]

    def stub(pool, layer, slots, *inputs):
        with torch.profiler.record_function("ssm::layer"):
            return torch.zeros_like(inputs[out_like])

    ops.family_ops = dataclasses.replace(ops.family_ops, decode=stub, verify=stub)
    return ops


def _launches(prof) -> collections.Counter:
    """Kernel launches in a CPU profile: each Triton launch (marked) once, and each outermost aten op that
    is not in NO_KERNEL once (what it calls is not counted again: on CPU, mean = sum + fill + div, a
    scalar operand is copied into a tensor, ... where CUDA launches one kernel; composites such as
    linear / to / reshape are looked through to the op that launches)."""
    out = collections.Counter()

    def walk(ev):
        if ev.name.startswith(("triton::", "ssm::")):
            out[ev.name] += 1
        elif ev.name.startswith("aten::") and ev.name.removeprefix("aten::") not in NO_KERNEL:
            out[ev.name] += 1
        else:
            for c in ev.cpu_children:
                walk(c)

    for ev in prof.events():
        if ev.cpu_parent is None:
            walk(ev)
    return out


def count_kernels(names, command: str) -> dict:
    """Device kernels per decode forward (T = 1) and verify forward (T = 5) of tiny copies of the named
    shapes in bf16, B = 2, Triton attention (the CUDA default), fused off vs on. The SSM kernels themselves
    are excluded (stubbed); SSMOps' preparation of their inputs is counted."""
    from triton.runtime.interpreter import InterpretedFunction

    run_orig = InterpretedFunction.run

    def run_marked(self, *a, **kw):
        with torch.profiler.record_function("triton::" + self.fn.__name__):
            return run_orig(self, *a, **kw)

    InterpretedFunction.run = run_marked
    res = {"command": command, "torch": torch.__version__, "models": {},
           "note": "CPU count of launches per forward (structure only; not a timing); SSM kernels stubbed"}
    try:
        for name in names:
            cfg = tiny_copy(model_config(name))
            weights = random_weights(cfg, seed=0, dtype=torch.bfloat16)
            entry = res["models"][name] = {}
            for fused in (False, True):
                model = HybridModel(cfg, weights, attn_impl="triton", fused=fused, dtype=torch.bfloat16)
                for mode, T in (("decode", 1), ("verify", 5)):
                    st = make_state(cfg, model, 2, "replay", 16, T if mode == "verify" else 0, 32, "cpu", "reference")
                    stub_ssm_kernels(st.ops, cfg.family)
                    tokens, pos = torch.zeros(2, T, dtype=torch.long), torch.full((2,), 20)
                    model.forward(tokens, pos, st.slots, mode, st.ctx, 20 + T)          # warm-up (RoPE tables)
                    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                        model.forward(tokens, pos, st.slots, mode, st.ctx, 20 + T)
                    c = _launches(prof)
                    ssm = c.pop("ssm::layer", 0)
                    triton_n = sum(v for k, v in c.items() if k.startswith("triton::"))
                    entry[f"{mode}_{'fused' if fused else 'torch'}"] = {
                        "kernels": sum(c.values()), "triton": triton_n, "aten": sum(c.values()) - triton_n,
                        "ssm_layers_excluded": ssm, "by_op": dict(sorted(c.items()))}
            d0, d1 = entry["decode_torch"]["kernels"], entry["decode_fused"]["kernels"]
            v0, v1 = entry["verify_torch"]["kernels"], entry["verify_fused"]["kernels"]
            print(f"{name}: {cfg.num_ssm_layers} {cfg.family} + {cfg.num_attn_layers} attention + "
                  f"{cfg.blocks.count('mlp')} MLP blocks; kernels per forward (SSM kernels excluded): "
                  f"decode {d0} -> {d1} fused, verify T=5 {v0} -> {v1} fused", flush=True)
    finally:
        InterpretedFunction.run = run_orig
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=["nemotron-3-nano-4b", "qwen3.5-4b"])
    p.add_argument("--out", default=str(ROOT / "bench" / "results" / "e2e_kernel_counts.json"))
    args = p.parse_args(argv)
    command = "python bench/e2e_kernel_counts.py " + " ".join(sys.argv[1:] if argv is None else argv)
    res = count_kernels(args.models, command)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
