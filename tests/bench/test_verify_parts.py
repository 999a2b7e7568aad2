"""bench/verify_parts.py (where a GDN verify launch's time goes, on the H200): its partial launches must do
the work they are named for, or the timings they report say nothing. Run here on CPU through the
interpreter with small shapes: the state products against torch, the read sums, the library's verify, the
other parts at least launch; and the plot is drawn from a results JSON."""

import torch

from sglang_replayssm.kernels import gdn as kgdn
from sglang_replayssm.kernels.tuning import KernelTuning

from tests.bench_scripts import load_bench
from tests.kernels.helpers import DEV, clone_pool, close, make_pool
from tests.kernels.test_gdn import inputs, params


def test_the_partial_launches_compute_what_they_are_named_for(tmp_path):
    vp = load_bench("verify_parts.py")
    g = torch.Generator().manual_seed(31)
    pool = make_pool("gdn", window=8, max_drafts=8, num_slots=5, num_layers=1, head_k_dim=32, gen=g)
    H, Dv, Dk = pool.geo.state_shape
    Hk = pool.geo.num_k_heads
    B, T = 3, 4
    slots = torch.tensor([4, 1, 3], dtype=torch.int32, device=DEV)
    pool.cursor[slots.long()] = torch.tensor([0, 2, 4], dtype=torch.int32, device=DEV)
    inp = dict(**inputs(g, B, H, Hk, Dv, Dk, T=T), **params(g, H))
    S = pool.ckpt[0][slots.long()]                                            # [B, H, Dv, Dk]
    q = inp["q"].float().repeat_interleave(H // Hk, dim=2)                    # [B, T, H, Dk]
    want = torch.einsum("bhvk,bthk->bthv", S, q)
    for part in ("s0dot", "s0dot_t", "read"):
        got = torch.zeros((B, T, H, Dv), device=DEV)
        vp.part_launch(part, pool, slots, inp, T, 16, 16, 1, out=got)()
        if part == "read":
            close(got[:, 0], S.sum(-1))
        else:
            close(got, want)
    ref = clone_pool(pool)
    vp.part_launch("verify", pool, slots, inp, T, 16, 16, 1)()
    kgdn.verify(ref, 0, slots, **inp, tuning=KernelTuning(block_v=16, block_k=16, num_warps=1))
    close(pool.rec_d, ref.rec_d)                                              # the same launch as the library's
    for part in ("verify_ieee", "pass", "finish"):
        vp.part_launch(part, pool, slots, inp, T, 16, 16, 1)()
    res = {"meta": {"batch": B, "device": "cpu"},
           "rows": [dict(T=t, config=c, part=p, us=1.0 + i, state_GBps=1.0)
                    for i, (t, c, p) in enumerate((t, c, p) for t in (8, 4) for c in ("64x16x1", "64x32x1")
                                                  for p in vp.PARTS)]}
    vp.plot(res, str(tmp_path / "verify_parts.png"))
    assert (tmp_path / "verify_parts.png").stat().st_size > 10_000
