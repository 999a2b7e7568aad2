"""The --replayssm-* flags on SGLang's own command line (prepare_server_args, what `sglang serve` and
`python -m sglang.launch_server` call): accepted spellings, and every bad value or combination
rejected with the flag's name in the message."""

from __future__ import annotations

import json
import os

import pytest

from sglang_replayssm.flags import ENV_VAR, FlagError, ReplaySSMOptions
from sglang_replayssm.sglang_plugin import options


def _parse(*argv):
    from sglang.srt.server_args import prepare_server_args

    return prepare_server_args(["--model-path", "dummy", *argv])


def test_flags_reach_server_args_and_spawned_env():
    sa = _parse("--replayssm-window", "8", "--replayssm-read-copy", "fp8", "--replayssm-ckpt-precision", "fp16-sr",
                "--no-replayssm-verify")
    want = {"window": 8, "ckpt_precision": "fp16-sr", "read_copy": "fp8", "decode": True, "verify": False}
    assert sa._replayssm_options == want
    assert json.loads(os.environ[ENV_VAR]) == want  # what spawned schedulers read
    assert options.active_options().window == 8
    assert sa.mamba_radix_cache_strategy == "auto"  # SGLang resolves it (extra_buffer is supported)
    import pickle

    assert pickle.loads(pickle.dumps(sa))._replayssm_options == want  # survives the trip to a scheduler


def test_no_flag_leaves_replayssm_off_and_sglang_unchanged():
    sa = _parse()
    assert not hasattr(sa, "_replayssm_options")
    assert ENV_VAR not in os.environ and options.active_options() is None
    assert sa.mamba_radix_cache_strategy == "auto"


@pytest.mark.parametrize("argv,flag", [
    (["--replayssm-window", "0"], "--replayssm-window"),
    (["--replayssm-window", "5000"], "--replayssm-window"),
    (["--replayssm-read-copy", "fp8", "--no-replayssm-decode"], "--replayssm-read-copy"),
    (["--replayssm-ckpt-precision", "fp16-sr", "--no-replayssm-decode"], "--replayssm-ckpt-precision"),
    (["--replayssm-decode", "--enable-linear-replayssm"], "--enable-linear-replayssm"),
    (["--replayssm-verify", "--enable-linear-replayssm-spec"], "--enable-linear-replayssm-spec"),
    (["--replayssm-decode", "--enable-int8-mamba-checkpoint"], "--enable-int8-mamba-checkpoint"),
])
def test_bad_combinations_raise_flag_error_naming_the_flag(argv, flag):
    with pytest.raises(FlagError) as err:
        _parse(*argv)
    assert flag in str(err.value) and err.value.flag == flag


@pytest.mark.parametrize("strategy,want", [("extra_buffer", "extra_buffer"), ("extra_buffer_lazy", "extra_buffer_lazy"),
                                           ("auto", "auto")])
def test_radix_strategy_with_speculative_decoding_is_accepted_as_given(strategy, want):
    """extra_buffer and extra_buffer_lazy with speculative decoding are supported (track slots at accepted-prefix
    boundaries, ``spec.py``); ``auto`` is resolved later, with the model's config (``cli.lazy_extra_buffer_by_default``:
    SGLang's choice, its ``extra_buffer`` made lazy)."""
    sa = _parse("--replayssm-window", "8", "--speculative-algorithm", "NGRAM", "--mamba-radix-cache-strategy", strategy)
    assert sa._replayssm_options["window"] == 8
    assert sa.mamba_radix_cache_strategy == want


@pytest.mark.parametrize("argv,flag", [
    (["--replayssm-window", "abc"], "--replayssm-window"),
    (["--replayssm-ckpt-precision", "fp8"], "--replayssm-ckpt-precision"),
    (["--replayssm-read-copy", "int4"], "--replayssm-read-copy"),
    (["--replayssm-window"], "--replayssm-window"),
])
def test_bad_values_rejected_by_argparse_naming_the_flag(argv, flag, capsys):
    with pytest.raises(SystemExit):
        _parse(*argv)
    assert flag in capsys.readouterr().err


def test_env_options_are_validated_too():
    os.environ[ENV_VAR] = json.dumps({"window": -1})
    try:
        with pytest.raises(FlagError, match="--replayssm-window"):
            _parse()
    finally:
        del os.environ[ENV_VAR]


def test_launcher_prepare_activates_defaults_and_rejects_bad_flags():
    from sglang_replayssm.sglang_plugin.launch import prepare

    sa = prepare(["--model-path", "dummy"])
    assert sa._replayssm_options["window"] == 16 and options.active_options().decode
    with pytest.raises(FlagError, match="--replayssm-window"):
        prepare(["--model-path", "dummy", "--replayssm-window", "0"])
    os.environ.update(ReplaySSMOptions(window=4).to_env())  # handed down by a caller, no flags
    assert prepare(["--model-path", "dummy"])._replayssm_options["window"] == 4
