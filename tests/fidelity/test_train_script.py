"""tools/train_tiny.py end to end at a toy size: it trains (the loss falls), writes a folder the native
engine loads, and a log with the held-out bits per byte."""

import json
import math

from sglang_replayssm.native.loader import load_model
from tools import train_tiny


def test_train_tiny_writes_a_loadable_model(tmp_path):
    out, log = tmp_path / "model", tmp_path / "log.json"
    res = train_tiny.main(["--family", "gdn", "--size", "micro", "--device", "cpu", "--steps", "30", "--seq", "64",
                           "--batch", "8", "--lr", "1e-2", "--warmup", "3", "--eval-crops", "2", "--log-every", "5",
                           "--out", str(out), "--log", str(log)])
    losses = [l for _, l in res["losses"]]
    assert losses[-1] < losses[0] - 1.0, losses            # from ~ln(272) = 5.6 nats down by > 1 nat
    assert math.isfinite(res["heldout_bpb"]) and res["heldout_bpb"] < 8.0
    assert json.loads(log.read_text())["steps"] == 30
    cfg, w = load_model(out)
    assert cfg.family == "gdn" and cfg.vocab_size == 272 and "b0.in_qkv" in w
