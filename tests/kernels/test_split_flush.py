"""The split decode's flush launch runs over a flush-row list built on the device (split_decode.flush_list),
with fewer row programs than rows: a step where every row flushes at once (more flush rows than
row programs, so each program takes several) must still match the reference, for every family."""
import pytest
import torch

from sglang_replayssm.kernels import gdn as kgdn, kda as kkda, mamba2 as km2, split_decode, tuning
from sglang_replayssm.kernels.constants import RC_FP8, RC_NONE, RC_NVFP4
from sglang_replayssm.kernels.tuning import KernelTuning
from sglang_replayssm.reference import gdn as rgdn, kda as rkda, mamba2 as rm2

from . import test_gdn, test_kda, test_mamba2
from .helpers import DEV, assert_untouched, clone_pool, close, compare_pools, make_pool, snapshot


def _step_inputs(family, g, pool, B):
    H, Dv, Dk = pool.geo.state_shape
    Hk = pool.geo.num_k_heads
    if family == "gdn":
        return test_gdn.inputs(g, B, H, Hk, Dv, Dk), test_gdn.params(g, H)
    if family == "mamba2":
        return test_mamba2.inputs(g, B, H, Hk, Dv, Dk), test_mamba2.params(g, H)
    return test_kda.inputs(g, B, H, Hk, Dv, Dk), test_kda.params(g, H, Dk)


@pytest.mark.parametrize("family,read_copy,whole", [("gdn", "fp8", False), ("mamba2", "none", False),
                                                    ("kda", "fp8", False), ("gdn", "none", True),
                                                    ("mamba2", "fp8", True), ("mamba2", "none", True)])
def test_every_row_flushing_at_once(family, read_copy, whole):
    """whole: flush_block_k = head_k_dim, the flush rows' tiles loaded once and folded in registers."""
    kmod, rmod = {"gdn": (kgdn, rgdn), "mamba2": (km2, rm2), "kda": (kkda, rkda)}[family]
    g = torch.Generator().manual_seed(7)
    window = 8
    pk = make_pool(family, window=window, num_slots=7, read_copy=read_copy, gen=g)
    B = 6
    slots = torch.tensor([3, 6, 1, 7, 2, 5], dtype=torch.int32, device=DEV)  # slot 4 untouched
    pk.cursor[slots.long()] = window - 1  # every row's record fills the window this step
    rows, count, nfp = split_decode.flush_list(slots, pk.cursor, window)
    assert int(count) == B and rows.tolist() == list(range(B))
    assert nfp < B  # the flush launch has fewer row programs than flush rows: each takes several
    pr = clone_pool(pk)
    before = snapshot(pk)
    x, par = _step_inputs(family, g, pk, B)
    fbk = {"tuning": KernelTuning(flush_block_k=pk.geo.state_shape[2])} if whole else {}
    ok = kmod.decode(pk, 0, slots, **x, **par, method="split", **fbk)
    orf = rmod.decode(pr, 0, slots, **x, **par)
    close(ok, orf)
    compare_pools(pk, pr, 0, read_copy, "fp32")
    assert_untouched(before, pk, slots.tolist())
    # the next step: no row flushes (cursor 0 after the advance), the flush launch has nothing to do
    pk.advance(slots)
    pr.advance(slots)
    x, par = _step_inputs(family, g, pk, B)
    close(kmod.decode(pk, 0, slots, **x, **par, method="split"), rmod.decode(pr, 0, slots, **x, **par))
    compare_pools(pk, pr, 0, read_copy, "fp32")


@pytest.mark.parametrize("fmin,working", [(1, 4), (4, 3), (8, 2), (16, 1)])
def test_flush_rows_min_splits_the_list_among_the_working_programs(monkeypatch, fmin, working):
    """fmin (tuning.flush_rows_min): 12 rows flush at once on 4 row programs (NFP); ceil(12 / fmin) of
    them work (fmin 4: three, the fourth idle), each folding every working-th listed row. Every row must
    be folded exactly once (a row folded twice or skipped leaves a wrong checkpoint), then a step with
    one flush row (a single program works) and the rest reading."""
    monkeypatch.setattr(split_decode, "flush_rows_min", lambda family, B, window: fmin)
    g = torch.Generator().manual_seed(11 + fmin)
    window = 8
    pk = make_pool("gdn", window=window, num_slots=14, read_copy="fp8", gen=g)
    slots = torch.randperm(13, generator=g)[:12].add(1).int().to(DEV)
    pk.cursor[slots.long()] = window - 1
    rows, count, nfp = split_decode.flush_list(slots, pk.cursor, window)
    assert int(count) == 12 and nfp == 4 and min(nfp, -(-12 // fmin)) == working
    pr = clone_pool(pk)
    for step in range(2):
        before = snapshot(pk)
        x, par = _step_inputs("gdn", g, pk, 12)
        close(kgdn.decode(pk, 0, slots, **x, **par, method="split"), rgdn.decode(pr, 0, slots, **x, **par))
        compare_pools(pk, pr, 0, "fp8", "fp32")
        assert_untouched(before, pk, slots.tolist())
        pk.advance(slots)
        pr.advance(slots)
        pk.cursor[slots[0].long()] = pr.cursor[slots[0].long()] = window - 1   # next: row 0 alone flushes


@pytest.mark.parametrize("read_copy", ["fp8", "none"])
def test_value_rows_not_a_multiple_of_the_block(read_copy):
    """Nemotron-Nano's 80 value rows per head in 32-row programs (the tuned split decode: 1-warp read
    programs, a 2-warp whole-row flush launch), scaled down: 24 rows in 16-row blocks, so the second
    block of every head is half masked. Several windows of steps with random cursors: every flush and
    every read matches the reference, and the masked rows write nothing (the next head's rows)."""
    g = torch.Generator().manual_seed(21)
    window = 4
    pk = make_pool("mamba2", window=window, num_slots=7, read_copy=read_copy, head_v_dim=24, gen=g)
    pr = clone_pool(pk)
    slots = torch.tensor([5, 2, 7, 0, 3], dtype=torch.int32, device=DEV)   # slot 0: padding
    knobs = KernelTuning(block_v=16, block_k=16, num_warps=1, flush_block_k=pk.geo.state_shape[2], flush_warps=2)
    flushes = 0
    for _ in range(2 * window + 1):
        flushes += int(((pk.cursor[slots[slots > 0].long()] + 1) == window).sum())
        before = snapshot(pk)
        x, par = _step_inputs("mamba2", g, pk, slots.numel())
        yk = km2.decode(pk, 0, slots, **x, **par, method="split", tuning=knobs)
        yr = rm2.decode(pr, 0, slots, **x, **par)
        close(yk[slots > 0], yr[slots > 0])
        compare_pools(pk, pr, 0, read_copy, "fp32")
        assert_untouched(before, pk, slots.tolist())
        pk.advance(slots)
        pr.advance(slots)
    assert flushes >= 6


def test_flush_list_picks_the_flush_rows_in_order():
    g = torch.Generator().manual_seed(3)
    cursor = torch.randint(0, 4, (40,), generator=g, dtype=torch.int32).to(DEV)
    slots = torch.randperm(39, generator=g)[:23].add(1).int().to(DEV)
    rows, count, nfp = split_decode.flush_list(slots, cursor, 4)
    want = [b for b, s in enumerate(slots.tolist()) if cursor[s] + 1 >= 4]
    assert int(count) == len(want) and rows[:len(want)].tolist() == want
    assert nfp == min(23, 2 * -(-23 // 4))


def test_flush_rows_min_keeps_the_family_s_working_programs_in_steady_state():
    """B / window rows flush per step in steady state: fmin = ceil(ceil(B / window) / FLUSH_PROGRAMS[family]),
    so that count keeps that many row programs working; families not listed get 1 (all work)."""
    for family, a in tuning.FLUSH_PROGRAMS.items():
        for B, window in ((256, 16), (64, 16), (512, 16), (1, 16), (7, 4)):
            fmin = tuning.flush_rows_min(family, B, window)
            n = -(-B // window)
            assert fmin >= 1 and min(-(-n // fmin), 2 * n) == min(a, n)
    assert tuning.flush_rows_min("mamba2", 256, 16) == 16
    assert tuning.flush_rows_min("kda", 256, 16) == 1 and tuning.flush_rows_min("gdn", 256, 16) == 1


def test_decode_plan_picks_the_measured_method_and_config():
    none = KernelTuning()
    # a read copy on a full grid: split with the tuned blocks (block_k capped at head_k_dim)
    m, kn = tuning.decode_plan("gdn", RC_FP8, 256, 32, 128, None, none)   # the delta families' flush: 32 columns
    assert m == "split" and kn == KernelTuning(block_v=32, block_k=128, num_warps=1, stages=None, flush_block_k=None,
                                       flush_warps=2)
    m, kn = tuning.decode_plan("mamba2", RC_FP8, 256, 128, 16, None, none)
    assert m == "split" and kn.block_v == 32 and kn.block_k == 16 and kn.flush_block_k == 16
    m, kn = tuning.decode_plan("mamba2", RC_FP8, 256, 96, 128, None, none)
    assert m == "split" and kn == KernelTuning(block_v=32, block_k=32, num_warps=1, stages=None, flush_block_k=128,
                                       flush_warps=2)
    # Mamba-2 with the fp32 checkpoint read: split too, in 16-row blocks with a 1-warp flush launch
    m, kn = tuning.decode_plan("mamba2", RC_NONE, 256, 96, 128, None, none)
    assert m == "split" and kn == KernelTuning(block_v=16, block_k=32, num_warps=1, stages=None, flush_block_k=128,
                                       flush_warps=1)
    m, kn = tuning.decode_plan("kda", RC_FP8, 256, 32, 128, None, none)
    assert m == "split" and kn == KernelTuning(block_v=32, block_k=64, num_warps=1, stages=2, flush_block_k=None,
                                       flush_warps=2)
    # fp32 GDN and NVFP4 on a full grid: fused, knobs untouched
    for fam, rc, b in (("gdn", RC_NONE, 256), ("kda", RC_NVFP4, 256), ("gdn", RC_NVFP4, 1)):
        assert tuning.decode_plan(fam, rc, b, 32, 128, None, none) == ("fused", none)
    # a grid under SMALL_GRID (batch * heads): fused; KDA and the fp8 read copy read whole state rows in one
    # chunk with 2 warps (4 below TINY_GRID pairs), fp32 GDN and Mamba-2 32-column chunks with 1 (4 up to
    # TINY_GRID pairs)
    for fam, rc, b, heads, want in (("mamba2", RC_FP8, 7, 128, KernelTuning(block_k=64, num_warps=2)),
                                    ("gdn", RC_FP8, 31, 32, KernelTuning(block_k=64, num_warps=2)),
                                    ("kda", RC_NONE, 1, 32, KernelTuning(block_k=64, num_warps=4)),
                                    ("kda", RC_FP8, 4, 32, KernelTuning(block_k=64, num_warps=2)),
                                    ("mamba2", RC_FP8, 1, 128, KernelTuning(block_k=64, num_warps=2)),
                                    ("gdn", RC_NONE, 1, 64, KernelTuning(num_warps=4)),
                                    ("gdn", RC_NONE, 4, 32, KernelTuning(num_warps=4)),
                                    ("mamba2", RC_NONE, 1, 128, KernelTuning(num_warps=4)),
                                    ("gdn", RC_NONE, 16, 32, KernelTuning(num_warps=1)),
                                    ("mamba2", RC_NONE, 7, 128, KernelTuning(num_warps=1))):
        assert b * heads < tuning.SMALL_GRID
        assert tuning.decode_plan(fam, rc, b, heads, 64, None, none) == ("fused", want)
    assert tuning.decode_plan("gdn", RC_NONE, 32, 32, 128, None, none) == ("fused", none)
    assert tuning.decode_plan("gdn", RC_FP8, 32, 32, 128, None, none)[0] == "split"
    assert tuning.decode_plan("kda", RC_NONE, 64, 32, 128, None, none)[0] == "split"
    # an explicit knob keeps the caller's configuration (the other knobs stay at the wrapper defaults)
    mine = KernelTuning(num_warps=2)
    assert tuning.decode_plan("gdn", RC_FP8, 256, 32, 128, "split", mine) == ("split", mine)
    with pytest.raises(ValueError, match="method must be None, 'fused' or 'split', got 'auto'"):
        tuning.decode_plan("gdn", RC_FP8, 256, 32, 128, "auto", none)


def test_a_flush_list_built_once_serves_every_layer_of_a_step():
    """decode(..., flush_list=split_decode.flush_list(...)[:2]) built once for a step and passed to two layers
    (the second as a function returning it) gives what each layer's own list gives; a list of the wrong
    shape or dtype is refused by name."""
    g = torch.Generator().manual_seed(13)
    window = 4
    pk = make_pool("gdn", window=window, num_slots=7, read_copy="fp8", num_layers=2, gen=g)
    pr = clone_pool(pk)
    slots = torch.tensor([4, 1, 6, 3, 5], dtype=torch.int32, device=DEV)
    for _ in range(window + 1):
        given = split_decode.flush_list(slots, pk.cursor, window)[:2]
        for layer in range(2):
            x, par = _step_inputs("gdn", g, pk, 5)
            close(kgdn.decode(pk, layer, slots, **x, **par, method="split",
                              flush_list=given if layer == 0 else (lambda: given)),
                  kgdn.decode(pr, layer, slots, **x, **par, method="split"))
            compare_pools(pk, pr, layer, "fp8", "fp32")
        pk.advance(slots)
        pr.advance(slots)
    x, par = _step_inputs("gdn", g, pk, 5)
    rows, count = split_decode.flush_list(slots, pk.cursor, window)[:2]
    with pytest.raises(ValueError, match="flush_list rows must have shape"):
        kgdn.decode(pk, 0, slots, **x, **par, method="split", flush_list=(rows[:3], count))
    with pytest.raises(ValueError, match="flush_list count must have dtype"):
        kgdn.decode(pk, 0, slots, **x, **par, method="split", flush_list=(rows, count.long()))


def test_verify_block_k_takes_32_columns_only_for_a_one_wave_grid():
    """GDN's tensor-core verify reads 32-column chunks where its one-warp programs fit one wave (B 64 of
    Qwen3.5-4B's 32 heads, 2 value blocks: 4096 <= 132 x 32), else 16; a given block_k or more warps win."""
    none = tuning.KernelTuning()
    assert tuning.verify_block_k("gdn", "mma", 64 * 32 * 2, 128, 132, none) == 32
    assert tuning.verify_block_k("gdn", "mma", 64 * 64 * 2, 128, 132, none) == 16     # 16/64 heads: two waves
    assert tuning.verify_block_k("gdn", "mma", 256 * 32 * 2, 128, 132, none) == 16
    assert tuning.verify_block_k("gdn", "fma", 64 * 32 * 2, 128, 132, none) == 16     # measured for mma only
    assert tuning.verify_block_k("mamba2", "mma", 64, 128, 132, none) == 16
    assert tuning.verify_block_k("gdn", "mma", 64, 16, 132, none) == 16                # head_k_dim 16
    assert tuning.verify_block_k("gdn", "mma", 64, 128, 132, tuning.KernelTuning(block_k=64)) == 64
    assert tuning.verify_block_k("gdn", "mma", 64, 128, 132, tuning.KernelTuning(num_warps=2)) == 16
