"""Step 1 of issue 21 on the H200: with the GPU harness active, import SGLang's server modules one by one
and report each result (OK, or the exception and where it was raised), then check the bridge's PyTorch ops
against SGLang's own implementations on the GPU. Prints a plain report; never stops at the first failure.

    PYTHONPATH=<src>:<site> python3 bench/h200/h200_probe.py
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback

MODULES = (
    "sglang", "sglang.srt.server_args", "sglang.srt.entrypoints.http_server", "sglang.srt.managers.scheduler",
    "sglang.srt.managers.detokenizer_manager", "sglang.srt.model_executor.model_runner",
    "sglang.srt.layers.attention.triton_backend", "sglang.srt.layers.attention.hybrid_linear_attn_backend",
    "sglang.srt.models.qwen3_next", "sglang.srt.models.nemotron_h", "sglang.srt.speculative.ngram_worker",
    "sglang.bench_serving", "sglang.launch_server", "sglang_replayssm.sglang_plugin",
)


def where(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)[-3:]
    return " <- ".join(f"{f.filename.split('site-packages/')[-1].split('/site/')[-1]}:{f.lineno}" for f in frames)


def probe_imports() -> None:
    for name in MODULES:
        t = time.time()
        try:
            importlib.import_module(name)
            print(f"IMPORT OK   {name} ({time.time() - t:.1f}s)", flush=True)
        except BaseException as e:   # noqa: BLE001 - the report is the point
            print(f"IMPORT FAIL {name}: {type(e).__name__}: {str(e)[:400]}  [{where(e)}]", flush=True)


def check(name, fn) -> None:
    try:
        print(f"OPCHECK {name}: {fn()}", flush=True)
    except BaseException as e:   # noqa: BLE001
        print(f"OPCHECK {name}: FAIL {type(e).__name__}: {str(e)[:300]}  [{where(e)}]", flush=True)


def probe_ops() -> None:
    import torch

    from sglang_replayssm.gpu_harness import gpu_ops

    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(0)

    def align():
        from sglang.kernels.ops.moe.moe_align_small_numel import moe_align_small_numel

        worst = 0
        for tokens, topk, experts, bs in ((5, 2, 4, 16), (7, 4, 64, 16), (3, 10, 512, 64), (16, 4, 8, 4)):
            ids = torch.randint(-1, experts, (tokens, topk), device=dev, dtype=torch.int32, generator=g)
            e1 = experts + 1
            cap = ((ids.numel() + e1 * (bs - 1)) + 3) // 4 * 4
            outs = []
            for impl in ("ours", "sglang"):
                st = torch.full((cap,), -7, dtype=torch.int32, device=dev)
                ex = torch.full(((cap + bs - 1) // bs,), -7, dtype=torch.int32, device=dev)
                n = torch.zeros(1, dtype=torch.int32, device=dev)
                if impl == "ours":
                    cs = torch.zeros(e1 + 1, dtype=torch.int32, device=dev)
                    gpu_ops.moe_align_block_size(ids, e1, bs, st, ex, n, cs, True, False)
                else:
                    moe_align_small_numel(ids, e1, bs, st, ex, n)
                outs.append((st, ex, n))
            total = int(outs[1][2])
            assert int(outs[0][2]) == total, (int(outs[0][2]), total)
            assert torch.equal(outs[0][0][:total], outs[1][0][:total])
            assert torch.equal(outs[0][1][: total // bs], outs[1][1][: total // bs])
            worst = max(worst, total)
        return f"equal to SGLang's Triton moe_align_small_numel on 4 cases (largest padded total {worst})"

    def norms():
        from sglang.srt.layers.layernorm import GemmaRMSNorm, RMSNorm

        x = torch.randn(33, 256, device=dev, dtype=torch.bfloat16, generator=g)
        r = torch.randn(33, 256, device=dev, dtype=torch.bfloat16, generator=g)
        errs = []
        for cls, gemma in ((RMSNorm, False), (GemmaRMSNorm, True)):
            m = cls(256, eps=1e-6).to(dev, torch.bfloat16)
            with torch.no_grad():
                m.weight.copy_(torch.randn(256, generator=g, device=dev) * 0.1 + (0 if gemma else 1))
            ref = m.forward_native(x.clone())
            out = torch.empty_like(x)
            (gpu_ops.gemma_rmsnorm if gemma else gpu_ops.rmsnorm)(out, x, m.weight, 1e-6, False)
            errs.append((out.float() - ref.float()).abs().max().item())
            ref2, rres = m.forward_native(x.clone(), r.clone())
            xi, ri = x.clone(), r.clone()
            (gpu_ops.gemma_fused_add_rmsnorm if gemma else gpu_ops.fused_add_rmsnorm)(xi, ri, m.weight, 1e-6, False)
            errs.append((xi.float() - ref2.float()).abs().max().item())
            errs.append((ri.float() - rres.float()).abs().max().item())
        assert max(errs) < 0.07, errs
        return f"max |ours - forward_native| over RMSNorm/GemmaRMSNorm (+residual) = {max(errs):.3g} (bf16)"

    def rope():
        from sglang.srt.layers.rotary_embedding import get_rope

        errs = []
        for neox in (True, False):
            r = get_rope(64, rotary_dim=16, max_position=512, base=10000, is_neox_style=neox, dtype=torch.float32)
            r = r.to(dev)
            pos = torch.randint(0, 500, (9,), device=dev, generator=g)
            q = torch.randn(9, 4 * 64, device=dev, generator=g)
            k = torch.randn(9, 1 * 64, device=dev, generator=g)
            qr, kr = r.forward_native(pos, q.clone(), k.clone())
            q2, k2 = q.clone(), k.clone()
            gpu_ops.rotary_embedding(pos, q2, k2, 64, r.cos_sin_cache.float(), neox)
            errs += [(q2 - qr).abs().max().item(), (k2 - kr).abs().max().item()]
        assert max(errs) < 1e-4, errs
        return f"max |ours - forward_native| partial rotary 16/64, neox and interleaved = {max(errs):.3g}"

    def topk():
        from sglang.srt.layers.moe.topk import fused_topk_torch_native

        logits = torch.randn(17, 64, device=dev, generator=g)
        w = torch.empty(17, 8, device=dev)
        i = torch.empty(17, 8, device=dev, dtype=torch.int32)
        gpu_ops.topk_softmax(w, i, logits, True, 0.0, None)
        rw, ri = fused_topk_torch_native(logits, logits, 8, True)[:2]
        assert torch.equal(i.long().sort(-1).values, ri.long().sort(-1).values)
        return f"top-8 of 64 ids equal fused_topk_torch_native, weights max err {(w.sort(-1).values - rw.float().sort(-1).values).abs().max().item():.3g}"

    for name, fn in (("moe_align_block_size", align), ("rmsnorm", norms), ("rotary_embedding", rope),
                     ("topk_softmax", topk)):
        check(name, fn)


def main() -> int:
    import torch

    print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda,
          "gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, flush=True)
    for dist in ("triton", "transformers", "tokenizers", "numpy", "sglang", "fastapi", "pydantic", "uvicorn"):
        try:
            from importlib.metadata import version

            print(f"version {dist} {version(dist)}")
        except Exception as e:   # noqa: BLE001
            print(f"version {dist} missing ({e})")
    from sglang_replayssm import gpu_harness

    gpu_harness.activate()
    probe_imports()
    probe_ops()
    return 0


if __name__ == "__main__":
    sys.exit(main())
