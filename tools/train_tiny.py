"""Train the small byte-level hybrid models (Mamba-2 + attention, GDN + attention) on the Python
standard library's text and save them in the HuggingFace format the native engine loads.

    python tools/train_tiny.py --family mamba2 --time-budget 100 --device cuda
    python tools/train_tiny.py --family gdn --steps 1200 --device cuda        # a fixed step count

Writes <out>/config.json + model.safetensors (default out: sglang_replayssm/native/assets/<name>/)
and a JSON log (--log) with the step count, losses and held-out bits per byte. With --time-budget the
step count is fixed after timing a few steps (and logged: rerun with --steps N to reproduce); the
learning-rate schedule then follows that count. Training data and held-out data never overlap
(tools/corpus.py splits by file).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tools import corpus, tiny_lm  # noqa: E402


def batch(data: torch.Tensor, B: int, T: int, gen: torch.Generator, device) -> torch.Tensor:
    starts = torch.randint(0, data.numel() - T - 1, (B,), generator=gen)
    idx = starts[:, None] + torch.arange(T + 1)
    return data[idx].to(device, non_blocking=True)


def heldout_crops(data: torch.Tensor, n: int, T: int) -> torch.Tensor:
    """n evenly spaced, non-overlapping crops of T+1 tokens of the held-out text (deterministic)."""
    n = min(n, (data.numel() - 1) // (T + 1))
    stride = (data.numel() - T - 1) // max(n - 1, 1)
    return torch.stack([data[i * stride: i * stride + T + 1] for i in range(n)])


def autocast(device):
    if torch.device(device).type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


@torch.no_grad()
def evaluate(model, crops: torch.Tensor, device, bs: int = 8) -> float:
    """Mean next-token cross-entropy (nats) over the crops."""
    model.eval()
    tot, cnt = 0.0, 0
    for i in range(0, crops.shape[0], bs):
        b = crops[i:i + bs].to(device)
        with autocast(device):
            logits = model(b[:, :-1])
        tot += F.cross_entropy(logits.float().flatten(0, 1), b[:, 1:].flatten(), reduction="sum").item()
        cnt += b[:, 1:].numel()
    model.train()
    return tot / cnt


def lr_at(step: int, total: int, peak: float, warmup: int) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    frac = (step - warmup) / max(total - warmup, 1)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(frac, 1.0))))


def train(args) -> dict:
    device = torch.device(args.device)
    torch.manual_seed(args.seed)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    data = corpus.load(args.corpus)
    hf = tiny_lm.hf_config(args.family, args.size)
    model = tiny_lm.TinyLM(hf, seed=args.seed, chunk=args.chunk).to(device)
    decay = [p for n, p in model.params.items() if p.dim() == 2]
    no_decay = [p for n, p in model.params.items() if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": args.wd}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")
    gen = torch.Generator().manual_seed(args.seed)
    crops = heldout_crops(data["heldout"], args.eval_crops, args.seq)
    log = {"family": args.family, "size": args.size, "params": model.num_params(), "seq": args.seq,
           "batch": args.batch, "chunk": args.chunk, "lr": args.lr, "corpus": data["source"],
           "train_tokens_available": int(data["train"].numel()), "heldout_tokens": int(data["heldout"].numel()),
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "losses": []}
    print(f"[{args.family}] {model.num_params() / 1e6:.2f} M params, corpus {data['source']}", flush=True)

    def step_fn(step, total):
        for grp in opt.param_groups:
            grp["lr"] = lr_at(step, total, args.lr, args.warmup)
        b = batch(data["train"], args.batch, args.seq, gen, device)
        with autocast(device):
            logits = model(b[:, :-1])
        loss = F.cross_entropy(logits.float().flatten(0, 1), b[:, 1:].flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    total = args.steps
    t0 = time.time()
    step = 0
    if total is None:   # time a few steps, then fix the step count for the schedule
        probe = 8
        for _ in range(2):
            step_fn(step, 10 ** 9)
            step += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.time()
        for _ in range(probe):
            step_fn(step, 10 ** 9)
            step += 1
        if device.type == "cuda":
            torch.cuda.synchronize()
        per = (time.time() - t1) / probe
        spent = time.time() - t0
        total = max(step + 1, min(args.max_steps, int((args.time_budget - spent) / per) + step))
        log["step_time_s"] = per
        print(f"[{args.family}] {per * 1e3:.1f} ms/step -> {total} steps", flush=True)
    while step < total:
        loss = step_fn(step, total)
        step += 1
        if step % args.log_every == 0 or step == total:
            lv = loss.item()
            log["losses"].append([step, lv])
            print(f"[{args.family}] step {step}/{total} loss {lv:.4f} ({lv / math.log(2):.3f} bpb) "
                  f"{time.time() - t0:.0f}s", flush=True)
    log["steps"] = total
    log["train_seconds"] = time.time() - t0
    log["train_tokens_seen"] = total * args.batch * args.seq
    log["final_train_loss_bpb"] = log["losses"][-1][1] / math.log(2)
    ce = evaluate(model, crops, device)
    log["heldout_ce_nats"] = ce
    log["heldout_bpb"] = ce / math.log(2)
    log["heldout_eval_tokens"] = int(crops[:, 1:].numel())
    print(f"[{args.family}] held-out {log['heldout_bpb']:.3f} bits/byte over {log['heldout_eval_tokens']} bytes",
          flush=True)
    out = Path(args.out) if args.out else tiny_lm.asset_path(args.family)
    meta = {k: log[k] for k in ("steps", "seq", "batch", "lr", "heldout_bpb", "params")}
    meta["command"] = " ".join(sys.argv)
    tiny_lm.save_hf(out, hf, model.weights(), metadata=meta)
    log["saved_to"] = str(out)
    if args.log:
        Path(args.log).write_text(json.dumps(log, indent=1) + "\n")
    return log


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--family", choices=tiny_lm.FAMILIES, required=True)
    ap.add_argument("--size", choices=("tiny", "micro"), default="tiny", help="micro: a toy size for CPU tests")
    ap.add_argument("--out", default=None, help="output folder (default: the native engine's assets folder)")
    ap.add_argument("--corpus", default=None, help="packed corpus .npz (tools/corpus.py); default: this Python's stdlib")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--steps", type=int, default=None, help="fixed number of optimizer steps")
    ap.add_argument("--time-budget", type=float, default=100.0, help="seconds of training when --steps is not given")
    ap.add_argument("--max-steps", type=int, default=6000)
    ap.add_argument("--seq", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eval-crops", type=int, default=64)
    ap.add_argument("--log-every", type=int, default=50)
    ap.add_argument("--log", default=None, help="write the training log JSON here")
    args = ap.parse_args(argv)
    for name in ("seq", "batch", "chunk", "eval_crops", "log_every", "max_steps"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.steps is not None and args.steps < 1:
        ap.error("--steps must be >= 1")
    return train(args)


if __name__ == "__main__":
    main()
