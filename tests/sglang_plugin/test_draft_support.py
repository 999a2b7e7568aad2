"""Draft algorithms SGLang 0.5.23 cannot run for a model, refused at start (``options.check_drafts``) with the flag
named, through SGLang's own argument parsing (``prepare_server_args``, what ``sglang serve`` calls) and our launcher
(exit 2, one line, before any weight loads), where SGLang would fail in its scheduler once the model loaded:

* EAGLE3 with a head that reads the target's aux hidden states on a target whose SGLang class cannot capture them
  (Nemotron-H: ``NemotronHForCausalLM`` has no ``set_eagle3_layers_to_capture``); such a head that reads the final
  hidden state instead (``eagle_config.use_aux_hidden_state: false``) is served
  (tests/sglang_server/test_eagle3_server.py);
* any EAGLE-family draft (EAGLE, EAGLE3, NEXTN) on a target that does not hand out its embedding and head (Kimi Linear:
  ``KimiLinearForCausalLM`` has no ``get_embed_and_head``);
* ``--no-replayssm-decode`` with speculative decoding on ``--device cpu``: SGLang's own commit of a hybrid model's
  state (``fused_mamba_state_scatter_with_mask``) runs on CUDA / XPU only;
* and ``--no-replayssm-verify`` with speculative decoding while ReplaySSM decode is on (checked where the pool is
  built too, but here before any weight loads).

The rules read SGLang's model classes, so each refusal is checked to be one SGLang itself makes (the class really lacks
the method) and the same rules accept the combinations the server tests serve."""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_replayssm.flags import FlagError, ReplaySSMOptions
from sglang_replayssm.sglang_plugin import options


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    from sglang_replayssm.cpu_harness.tiny_checkpoints import KIMI, write_checkpoint, write_eagle3_head

    out = tmp_path_factory.mktemp("draft-support")
    f = {fam: write_checkpoint(fam, out / fam, seed=0) for fam in ("qwen3_next", "nemotron_h", KIMI)}
    f["aux_head"] = write_eagle3_head(f["qwen3_next"], out / "aux_head", aux_layers=[0, 1, 2])
    f["m2_aux_head"] = write_eagle3_head(f["nemotron_h"], out / "m2_aux_head", aux_layers=[0, 1, 2])
    f["m2_final_head"] = write_eagle3_head(f["nemotron_h"], out / "m2_final_head")
    f["kda_final_head"] = write_eagle3_head(f[KIMI], out / "kda_final_head")
    return f


def _parse(*argv):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(["--replayssm-window", "4", *argv])


def _eagle3(target: Path, head: Path) -> list[str]:
    return ["--model-path", str(target), "--speculative-algorithm", "EAGLE3", "--speculative-draft-model-path",
            str(head), "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "3"]


REFUSED = {
    # name: (argv from the folders, the flag named, what the message says, the SGLang class and the method it lacks)
    "nemotron_h-eagle3-aux": (lambda f: _eagle3(f["nemotron_h"], f["m2_aux_head"]), "--speculative-algorithm",
                              "set_eagle3_layers_to_capture", ("NemotronHForCausalLM", "set_eagle3_layers_to_capture")),
    "kimi-eagle3": (lambda f: _eagle3(f["kimi_linear"], f["kda_final_head"]), "--speculative-algorithm",
                    "get_embed_and_head", ("KimiLinearForCausalLM", "get_embed_and_head")),
    "kimi-nextn": (lambda f: ["--model-path", str(f["kimi_linear"]), "--speculative-algorithm", "NEXTN",
                              "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
                              "--speculative-num-draft-tokens", "3"],
                   "--speculative-algorithm", "get_embed_and_head", ("KimiLinearForCausalLM", "get_embed_and_head")),
    "no-verify-ngram": (lambda f: ["--model-path", str(f["qwen3_next"]), "--no-replayssm-verify",
                                   "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"],
                        "--no-replayssm-verify", "needs --replayssm-verify", None),
    "no-decode-ngram-cpu": (lambda f: ["--model-path", str(f["qwen3_next"]), "--device", "cpu", "--no-replayssm-decode",
                                       "--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"],
                            "--no-replayssm-decode", "fused_mamba_state_scatter_with_mask", None),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_sglang_parsing_refuses_what_sglang_cannot_run(folders, name):
    argv, flag, says, lacks = REFUSED[name]
    with pytest.raises(FlagError) as err:
        _parse(*argv(folders))
    assert err.value.flag == flag and says in str(err.value) and "\n" not in str(err.value), str(err.value)
    if lacks is not None:   # the rule's premise: SGLang's class really lacks the method
        cls = options.sglang_model_class(lacks[0])
        assert cls is not None and cls.__name__ == lacks[0] and not hasattr(cls, lacks[1])


def _ns(argv: list[str]) -> argparse.Namespace:
    """The argparse view SGLang's ``from_cli_args`` hands the plugin (only the names ``check_drafts`` reads)."""
    it, ns = iter(argv), argparse.Namespace(device="cpu", speculative_draft_model_path=None)
    for a in it:
        setattr(ns, a[2:].replace("-", "_"), next(it))
    return ns


@pytest.mark.parametrize("case", ["qwen3_next-eagle3-aux", "nemotron_h-eagle3-final", "qwen3_next-nextn",
                                  "kimi-ngram", "nemotron_h-ngram"])
def test_what_the_server_tests_serve_is_accepted(folders, case):
    f = folders
    argv = {"qwen3_next-eagle3-aux": _eagle3(f["qwen3_next"], f["aux_head"]),
            "nemotron_h-eagle3-final": _eagle3(f["nemotron_h"], f["m2_final_head"]),
            "qwen3_next-nextn": ["--model-path", str(f["qwen3_next"]), "--speculative-algorithm", "NEXTN"],
            "kimi-ngram": ["--model-path", str(f["kimi_linear"]), "--speculative-algorithm", "NGRAM"],
            "nemotron_h-ngram": ["--model-path", str(f["nemotron_h"]), "--speculative-algorithm", "NGRAM"]}[case]
    options.check_drafts(ReplaySSMOptions(window=4), _ns(argv))


def test_the_launcher_refuses_at_start_with_one_line_naming_the_flag(folders):
    """``python -m sglang_replayssm.launch --engine sglang --device cpu`` with a Nemotron-H EAGLE3 head that reads aux
    hidden states: exit 2 and one error line naming the flag, within seconds (SGLang alone fails in its scheduler
    after the weights loaded)."""
    argv = [sys.executable, "-m", "sglang_replayssm.launch", "--engine", "sglang", "--device", "cpu",
            "--port", "1", *_eagle3(folders["nemotron_h"], folders["m2_aux_head"])]
    t0 = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    took = time.monotonic() - t0
    assert r.returncode == 2, r.stderr[-3000:]
    errors = [ln for ln in r.stderr.splitlines() if "error:" in ln]
    assert len(errors) == 1 and errors[0].split("error: ", 1)[1].startswith("--speculative-algorithm: EAGLE3"), errors
    assert "NemotronHForCausalLM" in errors[0] and "use_aux_hidden_state: false" in errors[0]
    assert "Traceback" not in r.stderr and "Uvicorn" not in r.stderr + r.stdout
    print(f"\nrefused in {took:.1f} s: {errors[0]}")
