"""A bad start is a one-line flag error (exit 2, no traceback) before the engine is built: a port in
use, a config.json with wrong-typed fields or in the wrong encoding, a model folder without a
tokenizer (issue 17, item 10). `python -m sglang_replayssm.launch` runs as a subprocess."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_replayssm import launch
from sglang_replayssm.native.config import HybridConfig, ModelConfigError

ASSETS = Path(__file__).resolve().parents[2] / "sglang_replayssm" / "native" / "assets"
NEMOTRON = dict(model_type="nemotron_h", architectures=["NemotronHForCausalLM"], hybrid_override_pattern="M-M*-",
                vocab_size=300, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                intermediate_size=96, mamba_num_heads=8, mamba_head_dim=8, ssm_state_size=16, n_groups=2,
                eos_token_id=2)
QWEN = json.loads((ASSETS / "tiny-gdn-hybrid" / "config.json").read_text())


def launch_cli(*args, timeout=120):
    return subprocess.run([sys.executable, "-m", "sglang_replayssm.launch", "--engine", "native", *args],
                          capture_output=True, text=True, timeout=timeout)


def assert_flag_error(r, message):
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert message in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and "native engine:" not in r.stdout, (r.stdout, r.stderr)


def model_folder(root: Path, name: str, config, tokenizer: bool = True) -> Path:
    d = root / name
    d.mkdir()
    (d / "config.json").write_bytes(config if isinstance(config, bytes) else json.dumps(config).encode())
    if tokenizer:
        (d / "tokenizer.json").write_text("{}")
    return d


def test_port_in_use_fails_before_the_engine_is_built():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        r = launch_cli("--port", str(port))
    assert_flag_error(r, f"--port: 127.0.0.1:{port} is already in use")


@pytest.mark.parametrize("name, config, field", [
    ("eos_str", dict(NEMOTRON, eos_token_id="x"), "eos_token_id"),
    ("hidden_str", dict(NEMOTRON, hidden_size="256"), "hidden_size"),
    ("layer_types_int", dict(QWEN, layer_types=5), "layer_types"),
    ("key_heads_zero", dict(QWEN, linear_num_key_heads=0), "linear_num_key_heads"),
    ("latin1", json.dumps(dict(NEMOTRON, model_name="café"), ensure_ascii=False).encode("latin-1"),
     "not UTF-8"),
])
def test_broken_config_is_a_model_path_error(tmp_path, name, config, field):
    r = launch_cli("--model-path", str(model_folder(tmp_path, name, config)), timeout=60)
    assert_flag_error(r, "--model-path: ")
    assert field in r.stderr.splitlines()[-1]


def test_every_wrong_typed_field_is_a_config_error_naming_it():
    """Each field of two real configs replaced by each wrong value: a ModelConfigError naming the field,
    or (where the value happens to be acceptable) a config; never another exception."""
    wrong = ["x", "256", 5, 0, -1, 2 ** 40, 1.5, float("nan"), True, [], [1, "a"], {}, {"a": 1}]
    bases = [NEMOTRON, dict(NEMOTRON, hybrid_override_pattern=None, layers_block_type=["mamba", "attention"]), QWEN]
    errors = 0
    for base in bases:
        for key in sorted(set(base) | {"rope_parameters", "mlp_only_layers", "n_groups", "layer_norm_epsilon"}):
            for value in wrong:
                try:
                    HybridConfig.from_hf(dict(base, **{key: value}))
                except ModelConfigError as e:
                    errors += 1
                    named = key in str(e) or (key in ("model_type", "architectures") and "unsupported model" in str(e))
                    assert named, (key, value, str(e))
    assert errors > 300


def test_folder_without_tokenizer_is_refused_unless_bytes_are_asked_for(tmp_path):
    d = model_folder(tmp_path, "no_tokenizer", NEMOTRON, tokenizer=False)
    r = launch_cli("--model-path", str(d), timeout=60)
    assert_flag_error(r, f"--model-path: {d} has no tokenizer files (tokenizer.json, tokenizer.model, "
                         "tokenizer_config.json)")
    assert "--tokenizer byte" in r.stderr
    parser = launch.native_parser()
    args = launch.engine_args_from(parser.parse_args(["--model-path", str(d), "--tokenizer", "byte"]), parser)
    assert args.tokenizer == "byte"
    with pytest.raises(SystemExit) as e:   # the byte tokenizer needs a vocabulary of 258
        launch.engine_args_from(parser.parse_args(["--model-path", str(model_folder(
            tmp_path, "small_vocab", dict(NEMOTRON, vocab_size=200), tokenizer=False)), "--tokenizer", "byte"]), parser)
    assert e.value.code == 2
    # the trained byte-level models in assets/ say so in their folder: served without the flag
    for name in ("tiny-gdn-hybrid", "tiny-mamba2-hybrid"):
        assert launch.engine_args_from(parser.parse_args(["--model-path", str(ASSETS / name)]), parser).tokenizer == "auto"
