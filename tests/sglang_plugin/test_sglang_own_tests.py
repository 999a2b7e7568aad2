"""SGLang's own CPU-runnable unit tests for the mamba pools, run with our plugin loaded.

The tests live in the SGLang repository (``test/registered/unit/mem_cache/test_mamba_unittest.py``:
HybridReqToTokenPool alloc/free, the conv-window layout, MambaRadixCache insert/evict/match with
copy-on-write of a cached mamba state, CPU offload round trip). They are not shipped in the sglang
wheel, so this test runs them from a checkout: ``SGLANG_SOURCE_TESTS=<sglang checkout>/test``.
They run in a fresh interpreter that first does what every SGLang process does (``load_plugins()``)
(without an accelerator, SGLang's ``get_device()`` is made to answer "cpu" first: it raises otherwise),
once with ReplaySSM off (plugin loaded, inert) and once with ReplaySSM on (our pool is the one
SGLang's tests exercise).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglang_replayssm.flags import ENV_VAR, ReplaySSMOptions

SOURCE = os.environ.get("SGLANG_SOURCE_TESTS")
FILES = ["registered/unit/mem_cache/test_mamba_unittest.py"]

BOOTSTRAP = """
import sys
import torch
if not torch.cuda.is_available():
    # SGLang's get_device() raises without an accelerator (its CPU engine build is not on PyPI): the
    # tests' device becomes "cpu", nothing else of them changes.
    import sglang.srt.utils as _u
    import sglang.srt.utils.common as _c
    _u.get_device = _c.get_device = lambda device_id=None: "cpu"
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
load_plugins()
import os
assert "sglang.srt.server_args.ServerArgs.from_cli_args" in HookRegistry._patched
pool_hooked = "sglang.srt.mem_cache.memory_pool.HybridReqToTokenPool.mamba_pool_cls" in HookRegistry._patched
assert pool_hooked == bool(os.environ.get("SGLANG_REPLAYSSM_OPTIONS"))
import pytest
sys.exit(pytest.main(sys.argv[1:]))
"""


@pytest.mark.skipif(not SOURCE, reason="SGLang's unit tests are not in the sglang wheel: set SGLANG_SOURCE_TESTS "
                                       "to the test/ directory of an sgl-project/sglang checkout")
@pytest.mark.parametrize("active", [False, True], ids=["plugin-loaded", "replayssm-on"])
def test_sglang_mamba_pool_unit_tests_pass_with_plugin(active, tmp_path):
    files = [str(Path(SOURCE) / f) for f in FILES]
    env = dict(os.environ)
    env.pop(ENV_VAR, None)
    if active:
        env.update(ReplaySSMOptions(window=16).to_env())
    proc = subprocess.run([sys.executable, "-c", BOOTSTRAP, "-q", "-p", "no:cacheprovider", "--rootdir",
                           str(tmp_path), *files], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
