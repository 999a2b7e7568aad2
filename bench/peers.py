"""The peers bench/kernels.py times beside ours, called the way their engines call them, in our harness
(a CUDA graph of L consecutive steps, do_bench median / L, L2 flushed before each replay):

* SGLang 0.5.23's GDN ReplaySSM speculative verify + commit (`--enable-linear-replayssm-spec`):
  `gdn_replayssm_spec_decode(launch_mode="verify")` for the verify of T chain drafts, then, as its
  `spec_utils.commit_mamba_states_after_verify` runs them once per step, `commit_gdn_replayssm_spec`
  (cursor move by the accepted count) and `commit_gdn_replayssm_circular` (rows whose ring is full fold).
  Its pool as SGLang allocates it for a fp32 checkpoint with spec decoding: compact d / k rings and their
  low parts in the activation dtype (bf16), g in fp32, ring length 16 (a power of two >= 2 T).
  Every draft accepted (the most folds), write positions staggered over the ring.
* FlashInfer's `flashinfer.mamba.checkpointing_ssu` (its Mamba-2 ReplaySSM kernel; vLLM's Mamba-2
  ReplaySSM backend), JIT-built with nvcc from the `flashinfer-python` wheel: T = 1 decode, ring
  L + 1 = 17 rows (its logical window L = 16), replay counts staggered 1..16 so that B / 16 rows flush in
  every step (a row flushes when its count + 2 T exceeds the ring), the scratch trio allocated so that
  every algorithm is open to it; `algorithm` "auto", "monolith" and "two-kernel" are each timed and the
  fastest is the peer's figure. fp32 state, and its 8-bit mode (fp8 e4m3 state + per-(head, row) scales).

Neither peer is ours: their code comes from the wheels at bench time (SGLang's kernels in the git-ignored
`.peer/` of `../shared/tools/peer_kernels.sh`; FlashInfer unpacked from its wheel), never from this repo.
"""
from __future__ import annotations

import importlib
import traceback

import torch

ACT = torch.bfloat16
SPEC_RING = 16          # SGLang's spec ring length (linear_replayssm_cache_len)


def peer(name):
    """The peer module ``name``, or None (printed why) when it cannot be imported here."""
    try:
        return importlib.import_module(name)
    except Exception as e:  # noqa: BLE001
        print(f"peer {name} unavailable: {type(e).__name__}: {e}")
        return None


SPEC = peer("sglang.kernels.ops.attention.linear.gdn_replayssm_spec_decode")
FI = peer("flashinfer.mamba.checkpointing_ssu")


# ----------------------------------------------------------------------------- SGLang spec verify (GDN)
def sglang_spec_steps(geo, B, T, L, dev="cuda"):
    """L steps of SGLang's GDN ReplaySSM verify of T chain drafts + its commit (every draft accepted), or
    None without the peer. Returns (steps, tensors): the verify's output ("out"), the batch's slots and the
    per-slot cursors the commit moves ("write_pos", "cache_base", "is_flush")."""
    if SPEC is None or geo["family"] != "gdn" or 2 * T > SPEC_RING:
        return None
    HV, H, V, K = geo["H"], geo["Hk"], geo["Dv"], geo["Dk"]
    S = B + 1
    r = lambda *s: torch.randn(*s, device=dev)
    ckpt = r(1, S, HV, V, K) * 0.05
    d_hi = (r(1, S, HV, SPEC_RING, V) * 0.1).to(ACT)
    k_hi = torch.nn.functional.normalize(r(1, S, H, SPEC_RING, K), dim=-1).to(ACT)
    d_lo, k_lo = torch.zeros_like(d_hi), torch.zeros_like(k_hi)
    g = -torch.rand(1, S, HV, SPEC_RING, device=dev) * 0.2
    slots = torch.randperm(S, device=dev)[:B].int()
    write_pos = torch.zeros(S, dtype=torch.int32, device=dev)
    write_pos[slots.long()] = (torch.randperm(B, device=dev) % (SPEC_RING - 2 * T + 1)).int()
    cache_base = torch.zeros(S, dtype=torch.int32, device=dev)
    is_flush = ((write_pos + 2 * T) > SPEC_RING).to(torch.int8)
    n = B * T
    q, k = (r(n, H, K).to(ACT) for _ in range(2))
    v = r(n, HV, V).to(ACT)
    a, b = r(n, HV).to(ACT), r(n, HV).to(ACT)
    A_log, dt_bias = r(HV) * 0.3, r(HV) * 0.3
    qsl = (torch.arange(B + 1, device=dev) * T).int()
    out = torch.empty(n, HV, V, device=dev, dtype=ACT)
    accepted = torch.full((B,), T, dtype=torch.int32, device=dev)

    def step():
        SPEC.gdn_replayssm_spec_decode(
            q=q, k=k, v=v, a=a, b=b, A_log=A_log, dt_bias=dt_bias, checkpoint_state=ckpt[0], d_cache=d_hi[0],
            k_cache=k_hi[0], g_cache=g[0], rawv_cache=d_lo[0], rawk_cache=k_lo[0], beta_cache=None, out=out,
            query_start_loc=qsl, ssm_state_indices=slots, replay_indices=slots, write_pos=write_pos,
            cache_base=cache_base, is_flush=is_flush, max_cache_len=SPEC_RING, max_spec_len=T, scale=K ** -0.5,
            use_qk_l2norm_in_kernel=True, null_block_id=-1, launch_mode="verify")
        SPEC.commit_gdn_replayssm_spec(write_pos, cache_base, is_flush, accepted, slots, max_cache_len=SPEC_RING,
                                       max_spec_len=T, fold_every_commit=False, null_block_id=-1)
        SPEC.commit_gdn_replayssm_circular(
            checkpoint_state=ckpt, d_cache=d_hi, k_cache=k_hi, g_cache=g, d_residual_cache=d_lo,
            k_residual_cache=k_lo, state_batch_indices=slots, replay_indices=slots, write_pos=write_pos,
            cache_base=cache_base, is_flush=is_flush, accept_lens=accepted, null_block_id=-1)
    return [step] * L, dict(out=out, slots=slots, write_pos=write_pos, cache_base=cache_base, is_flush=is_flush)


# ----------------------------------------------------------------------------- FlashInfer checkpointing_ssu (Mamba-2)
FI_ALGORITHMS = ("auto", "monolith", "two-kernel")


class FlashInferSSU:
    """One batch of FlashInfer checkpointing_ssu decode steps (T = 1) on its own ring layout."""

    def __init__(self, geo, B, L, state="fp32", dev="cuda"):
        H, G, P, N = geo["H"], geo["Hk"], geo["Dv"], geo["Dk"]
        S, ring = B + 1, L + 1
        self.B, self.L = B, L
        r = lambda *s: torch.randn(*s, device=dev)
        st = r(S, H, P, N) * 0.05
        self.scale = None
        if state == "fp8":
            amax = st.abs().amax(-1).clamp_min(1e-12)
            self.scale = (amax / 448.0).float()
            st = (st / self.scale[..., None]).to(torch.float8_e4m3fn)
        self.state = st
        self.x_cache = r(S, H, ring, P).to(ACT)
        self.B_cache = r(S, G, ring, N).to(ACT)
        self.dt_cache = torch.rand(S, H, ring, device=dev) * 0.1
        self.ring_start = torch.zeros(S, dtype=torch.int32, device=dev)
        self.slots = torch.randperm(S, device=dev)[:B].int()
        self.counts = torch.zeros(S, dtype=torch.int32, device=dev)
        self.counts[self.slots.long()] = (1 + torch.randperm(B, device=dev) % L).int()
        self.x = r(B, 1, H, P).to(ACT)
        self.dt = r(B, 1, H, 1).to(ACT).expand(B, 1, H, P)
        self.A = (-torch.rand(H, 1, 1, device=dev)).expand(H, P, N)
        self.Bm, self.C = r(B, 1, G, N).to(ACT), r(B, 1, G, N).to(ACT)
        self.D = r(H, 1).expand(H, P)
        self.dt_bias = (r(H, 1) * 0.3).expand(H, P)
        self.z = r(B, 1, H, P).to(ACT)
        self.out = torch.empty(B, 1, H, P, device=dev, dtype=ACT)
        self.scratch = FI.allocate_checkpointing_ssu_scratch(B, H, 1, L, ACT, dev)

    def call(self, algorithm="auto"):
        cb, cum, old = self.scratch
        FI.checkpointing_ssu(self.state, self.x_cache, self.B_cache, self.dt_cache, self.ring_start, self.counts,
                             self.x, self.dt, self.A, self.Bm, self.C, self.out, D=self.D, z=self.z,
                             dt_bias=self.dt_bias, dt_softplus=True, state_batch_indices=self.slots,
                             state_scale=self.scale, cb_scaled=cb, cumAdt_vec=cum, cb_old=old, algorithm=algorithm)
        return self.out

    def steps(self, algorithm):
        return [lambda: self.call(algorithm)] * self.L


_FI_BUILD_FAILED: set = set()   # (geometry, state) whose JIT build failed: not tried again (a build takes minutes)


def _fi_build_failed(geo, state, e) -> bool:
    if "Ninja build failed" in str(e):
        _FI_BUILD_FAILED.add((geo["name"], state))
        return True
    return False


def flashinfer_check(geo, dev="cuda"):
    """FlashInfer with nothing to replay (counts 0) against our reference's conventional step of the same
    state and token: max relative error of the output (is the peer called with the same conventions?)."""
    from sglang_replayssm.reference import mamba2 as rm2
    if (geo["name"], "fp32") in _FI_BUILD_FAILED:
        return None
    run = FlashInferSSU(geo, 6, 16, dev=dev)
    run.counts.zero_()
    st = run.state[run.slots.long()].clone()
    try:
        o = run.call("monolith")[:, 0].float()
    except RuntimeError as e:
        if _fi_build_failed(geo, "fp32", e):
            print(f"flashinfer checkpointing_ssu does not build for {geo['name']}: {str(e)[-300:]}")
            return None
        raise
    ref, _ = rm2.conventional_step(st, run.x[:, 0].float(), run.dt[:, 0, :, 0].float(), run.A[:, 0, 0],
                                   run.Bm[:, 0].float(), run.C[:, 0].float(), run.D[:, 0], run.dt_bias[:, 0],
                                   run.z[:, 0].float())
    return ((o - ref).double().norm() / ref.double().norm()).item()


def time_peers(geo, B, L, bench_graph, record, rep, nbytes_decode, nbytes_verify, verify_T=(2, 4, 8)):
    """Time the peers of one geometry at batch B and record their rows (kernel names: sglang_spec_verify_T<T>,
    flashinfer_ssu[_fp8][_<algorithm>] and the peer's best, flashinfer_ssu / flashinfer_ssu_fp8)."""
    name = geo["name"]
    if geo["family"] == "gdn" and SPEC is not None:
        for T in verify_T:
            try:
                steps, spec = sglang_spec_steps(geo, B, T, L)
                out = spec["out"]
                ms = bench_graph(steps, rep)
                nb = nbytes_verify(geo, B, T)
                record(geo=name, B=B, kernel=f"sglang_spec_verify_T{T}", ms=ms, GBps=nb / ms / 1e6, bytes=nb, T=T,
                       finite=bool(torch.isfinite(out).all()), note=f"{ms / T:.4f} ms/draft")
            except Exception:  # noqa: BLE001
                traceback.print_exc()
    if geo["family"] == "mamba2" and FI is not None:
        for state in ("fp32", "fp8"):
            if (name, state) in _FI_BUILD_FAILED:
                print(f"flashinfer {state} at {name}: skipped (its JIT build failed)")
                continue
            best = None
            try:
                run = FlashInferSSU(geo, B, L, state=state)
            except Exception:  # noqa: BLE001
                traceback.print_exc()
                continue
            nb = nbytes_decode(geo, B, "none" if state == "fp32" else "fp8")
            for algo in FI_ALGORITHMS:
                try:
                    ms = bench_graph(run.steps(algo), rep)
                except Exception as e:  # noqa: BLE001
                    print(f"flashinfer {state} {algo} at {name} B={B}: {type(e).__name__}: {str(e)[:300]}")
                    if _fi_build_failed(geo, state, e):
                        break
                    continue
                tag = "flashinfer_ssu" + ("_fp8" if state == "fp8" else "")
                record(geo=name, B=B, kernel=f"{tag}_{algo}", ms=ms, GBps=nb / ms / 1e6, bytes=nb)
                if best is None or ms < best[0]:
                    best = (ms, algo)
            if best:
                record(geo=name, B=B, kernel=tag, ms=best[0], GBps=nb / best[0] / 1e6, bytes=nb, algorithm=best[1])
            del run


# ----------------------------------------------------------------------------- the README table
PAIRS = [  # (what, ours, peers: the best of them is the bar)
    ("decode, fp32 read", "ours_replay_fp32", ("sglang_replayssm", "flashinfer_ssu", "sglang_conventional")),
    ("decode, fp8 read copy", "ours_replay_fp8", ("sglang_replayssm", "flashinfer_ssu_fp8", "flashinfer_ssu")),
] + [(f"verify + commit, T = {T}", f"ours_verify_T{T}", (f"sglang_spec_verify_T{T}",)) for T in (2, 4, 8)]


def peer_table(results):
    """Markdown rows: per geometry, batch and comparison, ours and the best peer (ms, GB/s) and their ratio."""
    rows = results["rows"]
    get = lambda g, B, k: next((r for r in rows if r["geo"] == g and r["B"] == B and r["kernel"] == k
                                and r.get("ms")), None)
    out = ["| geometry | B | step | ours ms (GB/s) | best peer | peer ms (GB/s) | peer / ours |",
           "|---|---|---|---|---|---|---|"]
    for g in dict.fromkeys(r["geo"] for r in rows):
        for B in sorted({r["B"] for r in rows if r["geo"] == g}):
            for what, ours, peers in PAIRS:
                o = get(g, B, ours)
                ps = [p for p in (get(g, B, k) for k in peers) if p]
                if not o or not ps:
                    continue
                p = min(ps, key=lambda r: r["ms"])
                out.append(f"| {g} | {B} | {what} | {o['ms']:.4f} ({o.get('GBps') or 0:.0f}) | {p['kernel']} | "
                           f"{p['ms']:.4f} ({p.get('GBps') or 0:.0f}) | **{p['ms'] / o['ms']:.2f}x** |")
    return "\n".join(out)
