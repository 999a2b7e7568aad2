"""Checkpoints as users have them: the m2-L4 (Nemotron-H) and gdn-L4-kernels (Qwen3-Next) servers start from the
tiny folders exactly as transformers 5 saves them (``conftest.TRANSFORMERS5_FOLDERS``), which SGLang 0.5.23 itself
cannot read; ``python -m sglang_replayssm.launch`` serves them through an overlay folder with SGLang's config names
(``sglang_replayssm/checkpoint_names.py``). Their family's tests (test_mamba2_server.py, test_gdn_server.py) hold
those servers to transformers' greedy tokens and stock SGLang's logprobs; this file checks, from the servers' logs,
that they were served through the overlay under the user's folder name (no server start of its own in a full run)."""

from __future__ import annotations

import re

import pytest

from . import checks
from .conftest import TRANSFORMERS5_FOLDERS


@pytest.mark.parametrize("name", sorted(TRANSFORMERS5_FOLDERS))
def test_folder_saved_by_transformers5_is_served_through_an_overlay(servers, name):
    if name not in servers.startup_s:   # run alone: start it here (in a full run its family's module did)
        checks.greedy_equals_transformers(servers.get(name))
    user_folder = servers.model_dir / TRANSFORMERS5_FOLDERS[name]
    log = (servers.log_dir / f"{name}.log").read_text(errors="replace")
    assert (f"{user_folder}: config.json uses transformers 5 names that SGLang 0.5.23 does not read; "
            f"serving it through {servers.log_dir / 'checkpoint-overlays'}") in log
    # SGLang logs its server args at start (as a dict): clients see the user's folder as the model name
    assert re.search(rf"served_model_name'?(=|: )'{re.escape(str(user_folder))}'", log), "served_model_name"
