"""Where a GDN verify launch's time goes (H200): the tensor-core verify kernel against launches of the same
grid that do only part of its work.

    PYTHONPATH=. python3 bench/verify_parts.py --out $OUT      # -> verify_parts.{json,png} (+ a table)
    python3 bench/verify_parts.py --plot bench/results/verify_parts.json   # redraw the PNG (no GPU)

Qwen3.5-4B GDN geometry (16 k-heads / 32 value heads, 128 x 128), fp32 checkpoint, batch 256, T chain
drafts, ring cursors spread over 0..15 - T + 1. Each part is a launch of one (value block, head, row)
program per tile, like the verify's; times are CUDA-graph medians of L launches (bench/kernels.py's
bench_graph), with the state's GB/s (the checkpoint's bytes / time). Parts:
  verify     kernels.gdn.verify (the library's default, method "mma")
  verify_ieee  the same with FMA dots (KernelTuning(dot_precision="ieee")) instead of 3xTF32 tensor-core dots
  read       the state's column chunks loaded and summed (the launch's read floor)
  s0dot      the drafts' rows X and the state: S0 X^T per chunk, one dot (no record keys, no X X^T)
  s0dot_t    the same dot the other way round: S0 X^T as dot(S0, X^T) (the state the left operand)
  pass       the verify's state pass (drafts.stacked_draft_pass: S0 X^T, K_r X^T, X X^T per chunk)
  finish     no state pass: the records, the within-draft solve, the outputs and the draft records
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton
import triton.language as tl

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from sglang_replayssm.kernels import gdn as kgdn  # noqa: E402
from sglang_replayssm.kernels.checks import next_pow2  # noqa: E402
from sglang_replayssm.kernels.constants import DOT_PREC  # noqa: E402
from sglang_replayssm.kernels.drafts import stacked_draft_pass, stacked_halves  # noqa: E402
from sglang_replayssm.kernels.gdn.verify import _gdn_drafts_finish  # noqa: E402
from sglang_replayssm.kernels.layer_views import LayerViews  # noqa: E402
from sglang_replayssm.kernels.quant_tiles import load_state_chunk  # noqa: E402
from sglang_replayssm.kernels.replay import load_records, ring_program  # noqa: E402
from sglang_replayssm.kernels.tuning import KernelTuning  # noqa: E402

PARTS = ("verify", "verify_ieee", "read", "s0dot", "s0dot_t", "pass", "finish")


@triton.jit
def _part_kernel(q_ptr, k_ptr, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, out_ptr, slots_ptr, cursor_ptr,
                 ckpt_ptr, recd_ptr, reck_ptr, recg_ptr, recv_ptr, recb_ptr, H: tl.constexpr, HK: tl.constexpr,
                 K: tl.constexpr, V: tl.constexpr, R: tl.constexpr, T: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr,
                 BKC: tl.constexpr, BR: tl.constexpr, PREC: tl.constexpr, PART: tl.constexpr):
    i_v, i_h, i_b, i_hk, slot, cur, o_v, mask_v, o_r, mask_r = ring_program(slots_ptr, cursor_ptr, H, HK, V, BV, BR)
    head_rows = (slot * H + i_h) * V
    o_x = tl.arange(0, 2 * BT)
    t_x = tl.where(o_x < BT, o_x, o_x - BT)
    x_rows = ((i_b * T + t_x) * HK + i_hk) * K
    x_base = tl.where(o_x < BT, q_ptr + x_rows, k_ptr + x_rows)
    mask_x = t_x < T
    out_rows = out_ptr + ((i_b * T + o_x) * H + i_h) * V          # rows 0..T-1 (the q half) are stored
    keep = (o_x < T)[:, None] & mask_v[None, :]
    if PART == "read":
        acc = tl.zeros([BV], dtype=tl.float32)
        for c in range(K // BKC):
            o_kc = c * BKC + tl.arange(0, BKC)
            acc += tl.sum(load_state_chunk(ckpt_ptr, ckpt_ptr, ckpt_ptr, ckpt_ptr, head_rows, 0, o_v, o_kc, mask_v,
                                           K, 0), axis=1)
        tl.store(out_ptr + ((i_b * T) * H + i_h) * V + o_v, acc, mask=mask_v)
    elif PART == "s0dot" or PART == "s0dot_t":
        acc = tl.zeros([2 * BT, BV], dtype=tl.float32)
        acc_t = tl.zeros([BV, 2 * BT], dtype=tl.float32)
        for c in range(K // BKC):
            o_kc = c * BKC + tl.arange(0, BKC)
            Xc = tl.load(x_base[:, None] + o_kc[None, :], mask=mask_x[:, None], other=0.0).to(tl.float32)
            S0 = load_state_chunk(ckpt_ptr, ckpt_ptr, ckpt_ptr, ckpt_ptr, head_rows, 0, o_v, o_kc, mask_v, K, 0)
            if PART == "s0dot":
                acc += tl.dot(Xc, tl.trans(S0), input_precision=PREC)
            else:
                acc_t += tl.dot(S0, tl.trans(Xc), input_precision=PREC)
        if PART == "s0dot":
            tl.store(out_rows[:, None] + o_v[None, :], acc, mask=keep)
        else:
            tl.store(out_rows[None, :] + o_v[:, None], acc_t, mask=tl.trans(keep))
    elif PART == "pass":
        S0X, KrX, XX, nx, is_q = stacked_draft_pass(q_ptr, k_ptr, i_b, i_hk, ckpt_ptr, ckpt_ptr, ckpt_ptr, ckpt_ptr,
                                                    head_rows, slot * H + i_h, o_v, mask_v,
                                                    reck_ptr + (slot * R * HK + i_hk) * K, o_r, mask_r, HK, K, T,
                                                    BT, BV, BKC, BR, 0, PREC, True, HK * K)
        S0X += tl.sum(KrX, axis=0)[:, None] + tl.sum(XX, axis=0)[:, None] + nx[:, None]
        tl.store(out_rows[:, None] + o_v[None, :], S0X, mask=keep)
    else:  # finish: the verify without its state pass (products zero, but not known to the compiler)
        z = cur.to(tl.float32) * 0.0
        S0X = tl.zeros([2 * BT, BV], dtype=tl.float32) + z
        KrX = tl.zeros([BR, 2 * BT], dtype=tl.float32) + z
        XX = tl.zeros([2 * BT, 2 * BT], dtype=tl.float32) + z
        rx = tl.zeros([2 * BT], dtype=tl.float32) + 1.0 + z
        Dr, w, gam, gtot = load_records(recd_ptr, recg_ptr, slot, i_h, o_r, mask_r, o_v, mask_v, H, V, R)
        SX = gam * S0X + tl.dot(tl.trans(KrX * w[:, None]), Dr, input_precision=PREC)
        SQ, SK, QK, KK = stacked_halves(SX, XX, BT, BV)
        _rq, rk = tl.split(tl.permute(tl.reshape(rx, [2, BT]), (1, 0)))
        o_t = tl.arange(0, BT)
        tok = i_b * T + o_t
        _gdn_drafts_finish(SQ, SK, QK, KK, rk, v_ptr, a_ptr, b_ptr, alog_ptr, dtb_ptr, slots_ptr, out_ptr,
                                k_ptr, recd_ptr, recg_ptr, recv_ptr, recb_ptr, reck_ptr + (slot * R * HK + i_hk) * K,
                                (tok * HK + i_hk) * K, tok, slot, cur, i_b, i_h, i_v, o_t, o_t < T, o_v, mask_v,
                                H, HK, K, V, R, T, BT, BV, BKC, False, H * V)


def _bench_kernels():
    """bench/kernel_harness.py (geometries, pools, inputs, the L-step graph timer)."""
    sys.path.insert(0, HERE)
    import kernel_harness
    return kernel_harness


def part_launch(part, pool, slots, inp, T, block_v, block_k, num_warps, out=None):
    """A callable that runs one launch of `part` (PARTS) on layer 0 of pool; the partial launches write
    out ([B, T, H, Dv] fp32, a new one if None: read its row sums to rows t = 0, the dots S0 q_t)."""
    if part in ("verify", "verify_ieee"):
        tuning = KernelTuning(block_v=block_v, block_k=block_k, num_warps=num_warps,
                              dot_precision="ieee" if part == "verify_ieee" else None)
        return lambda: kgdn.verify(pool, 0, slots, **inp, tuning=tuning)
    lv = LayerViews(pool, 0)
    B = slots.shape[0]
    if out is None:
        out = torch.empty((B, T, lv.H, lv.Dv), dtype=torch.float32, device=lv.device)
    grid = (triton.cdiv(lv.Dv, block_v), lv.H, B)
    kw = dict(H=lv.H, HK=lv.Hk, K=lv.Dk, V=lv.Dv, R=lv.R, T=T, BT=max(8, next_pow2(T)), BV=block_v, BKC=block_k,
              BR=max(16, next_pow2(lv.window)), PREC=DOT_PREC, PART=part,
              num_warps=num_warps)
    return lambda: _part_kernel[grid](inp["q"], inp["k"], inp["v"], inp["a"], inp["b"], inp["A_log"],
                                      inp["dt_bias"], out, slots, lv.cursor, lv.ckpt, lv.rec_d, lv.rec_k, lv.rec_g,
                                      lv.rec_v, lv.rec_beta,
                                      **kw)


def plot(res: dict, path: str) -> None:
    """One panel per T: each part's microseconds per launch, grouped by launch shape (the read floor hatched)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = res["rows"]
    tokens = sorted({r["T"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(tokens), figsize=(7 * len(tokens), 4.4), squeeze=False)
    for ax, T in zip(axes[0], tokens):
        mine = [r for r in rows if r["T"] == T]
        configs = list(dict.fromkeys(r["config"] for r in mine))
        parts = [q for q in PARTS if any(r["part"] == q for r in mine)]
        w = 0.8 / len(parts)
        for i, part in enumerate(parts):
            us = {r["config"]: r["us"] for r in mine if r["part"] == part}
            xs = [x + (i - (len(parts) - 1) / 2) * w for x, c in enumerate(configs) if c in us]
            ax.bar(xs, [us[c] for c in configs if c in us], w, label=part,
                   hatch="//" if part == "read" else None)
        ax.set_xticks(range(len(configs)))
        ax.set_xticklabels([f"{c}\n(BV x BK x warps)" for c in configs], fontsize=8)
        ax.set_ylabel("us per launch")
        ax.set_title(f"GDN verify parts, T = {T}, batch {res['meta']['batch']} ({res['meta']['device']})", fontsize=9)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--tokens", type=int, nargs="+", default=[8, 4], help="draft tokens T per row")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    p.add_argument("--configs", nargs="+", default=["64x16x1", "64x32x1", "64x32x2", "128x32x2", "128x32x4"],
                   help="BVxBKxW launch shapes (the verify's default is 64x16x1)")
    p.add_argument("--rep", type=int, default=200, help="do_bench milliseconds per case")
    p.add_argument("--out", default=None, help="folder for verify_parts.json and .png")
    p.add_argument("--plot", default=None, metavar="JSON", help="only redraw the PNG of a results JSON")
    args = p.parse_args()
    if args.plot:
        with open(args.plot) as fh:
            plot(json.load(fh), os.path.splitext(args.plot)[0] + ".png")
        return
    if not torch.cuda.is_available():
        raise SystemExit("verify_parts.py needs a CUDA GPU")
    bk = _bench_kernels()
    geo = next(g for g in bk.GEOMS if g["name"] == "gdn_qwen35_4b")
    B = args.batch
    pool = bk.make_pool(geo, B + 1)
    slots = torch.randperm(B, device=bk.DEV).int() + 1
    state_bytes = B * geo["H"] * geo["Dv"] * geo["Dk"] * 4
    rows = []
    for T in args.tokens:
        inp = bk.make_inputs(geo, B, T)
        pool.cursor.zero_()
        pool.cursor[slots.long()] = torch.randint(0, bk.L - T + 1, (B,), device=bk.DEV, dtype=torch.int32)
        for cfg in args.configs:
            bv, bkc, nw = (int(x) for x in cfg.split("x"))
            for part in args.parts:
                try:
                    f = part_launch(part, pool, slots, inp, T, bv, bkc, nw)
                    ms = bk.bench_graph([f] * bk.L, args.rep)
                except Exception as e:  # noqa: BLE001 - a shape a part cannot compile: report, go on
                    print(f"T={T} {cfg:9s} {part:8s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
                    continue
                row = dict(T=T, config=cfg, part=part, us=ms * 1e3, state_GBps=state_bytes / (ms * 1e-3) / 1e9)
                rows.append(row)
                print(f"T={T} {cfg:9s} {part:8s} {row['us']:8.1f} us  {row['state_GBps']:7.0f} GB/s", flush=True)
    res = {"meta": {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
                    "batch": B, "geometry": geo, "command": "python3 bench/verify_parts.py " + " ".join(sys.argv[1:]),
                    "time": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}, "rows": rows}
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "verify_parts.json"), "w") as fh:
            json.dump(res, fh, indent=1)
        plot(res, os.path.join(args.out, "verify_parts.png"))


if __name__ == "__main__":
    main()
