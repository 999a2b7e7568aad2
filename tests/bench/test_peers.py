"""bench/peers.py: the peer harnesses do what bench/README.md says (SGLang's spec verify commits every draft
of the step; the table's ratio is the best peer over ours)."""
from __future__ import annotations

import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
import peers  # noqa: E402


def test_peer_table_takes_the_fastest_peer_of_each_cell():
    rows = [dict(geo="g", B=64, kernel="ours_replay_fp32", ms=0.10, GBps=1000.0),
            dict(geo="g", B=64, kernel="sglang_replayssm", ms=0.12, GBps=900.0),
            dict(geo="g", B=64, kernel="sglang_conventional", ms=0.08, GBps=1500.0),
            dict(geo="g", B=64, kernel="ours_verify_T4", ms=0.20),
            dict(geo="g", B=64, kernel="sglang_spec_verify_T4", ms=0.25)]
    table = peers.peer_table({"rows": rows})
    decode = next(line for line in table.splitlines() if "decode, fp32 read" in line)
    assert "sglang_conventional" in decode and "**0.80x**" in decode     # 0.08 / 0.10: the best peer, not SGLang's ReplaySSM
    verify = next(line for line in table.splitlines() if "T = 4" in line)
    assert "**1.25x**" in verify
    assert not any("fp8 read copy" in line for line in table.splitlines())  # no row without ours


@pytest.mark.skipif(peers.SPEC is None, reason="needs SGLang's gdn_replayssm_spec_decode (pip install -e .[test])")
@pytest.mark.timeout(600)
def test_sglang_spec_harness_verifies_and_commits_every_draft():
    if not os.environ.get("TRITON_INTERPRET") and not torch.cuda.is_available():
        pytest.skip("SGLang's Triton kernels need a GPU or TRITON_INTERPRET=1")
    torch.manual_seed(0)
    geo = dict(name="tiny", family="gdn", H=2, Hk=1, Dv=32, Dk=32)
    T = 2
    steps, st = peers.sglang_spec_steps(geo, 3, T, 1, dev="cuda" if torch.cuda.is_available() else "cpu")
    rows = st["slots"].long()
    assert not st["is_flush"].any()                             # SGLang folds at the commit: no row starts due
    st["write_pos"][rows[0]] = peers.SPEC_RING - 2 * T          # this row's window fills with this step's drafts
    wp0, base0 = st["write_pos"][rows].clone(), st["cache_base"][rows].clone()
    st["out"].fill_(float("nan"))
    steps[0]()
    assert torch.isfinite(st["out"]).all() and st["out"].abs().sum() > 0   # every draft of every row verified
    # every draft accepted: the cursor moves by T; a row whose next window would not fit folds at the commit
    # (SGLang's early flush: write_pos + 2 T > ring) and starts an empty ring where its records ended
    moved = wp0 + T
    fold = moved + 2 * T > peers.SPEC_RING
    assert fold.any() and not fold.all()
    assert torch.equal(st["write_pos"][rows], torch.where(fold, torch.zeros_like(moved), moved))
    assert torch.equal(st["cache_base"][rows], torch.where(fold, (base0 + moved) % peers.SPEC_RING, base0))
    assert not st["is_flush"][rows].any()
