"""`transformers` reads a real model folder's tokenizer (issue 17, item 17): it is a base dependency
(pyproject.toml), and an install without it gets a one-line `--model-path:` error naming the package,
not a traceback from inside the engine. The launcher runs as a subprocess with `transformers` made
unimportable (sys.modules["transformers"] = None, as Python spells "not installed")."""

import subprocess
import sys
import tomllib
from pathlib import Path

from .live_server import free_port
from .test_start_checks import NEMOTRON, assert_flag_error, model_folder

ROOT = Path(__file__).resolve().parents[2]


def test_transformers_is_a_base_dependency():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert any(d.split(">")[0].split("=")[0].strip() == "transformers" for d in project["dependencies"])


def test_without_transformers_a_model_folder_is_a_clear_flag_error(tmp_path):
    folder = model_folder(tmp_path, "hf", NEMOTRON)
    code = ("import sys; sys.modules['transformers'] = None; from sglang_replayssm import launch; "
            f"sys.exit(launch.main(['--engine', 'native', '--model-path', {str(folder)!r}, '--port', '{free_port()}']))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert_flag_error(r, "--model-path: reading the tokenizer of")
    assert "needs the `transformers` package" in r.stderr
