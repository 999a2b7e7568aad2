"""The engine's Triton path (what runs on CUDA), here under TRITON_INTERPRET=1 (tests/conftest.py):
same greedy tokens as the reference path, for ReplaySSM decode, speculative verify and the
conventional baseline."""

import os

import pytest

from sglang_replayssm.flags import ReplaySSMOptions
from sglang_replayssm.native.engine import Engine, EngineArgs, SamplingParams

pytestmark = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1",
                                reason="Triton on CPU needs TRITON_INTERPRET=1 before triton is imported")
PROMPTS = ["Hello world hello world", "abcdefgabcdefg"]


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("opts, k", [(dict(window=3), 2), (dict(decode=False), 0)],
                         ids=["replay-decode-and-spec", "conventional"])
def test_triton_path_equals_reference(family, opts, k):
    outs = {}
    for kernels in ("reference", "triton"):
        e = Engine(EngineArgs(model_path=f"embedded:{family}", max_running_requests=2, kernels=kernels,
                              speculative_num_draft_tokens=k, replayssm=ReplaySSMOptions(**opts)))
        outs[kernels] = e.generate(PROMPTS, SamplingParams(max_tokens=8))
        if kernels == "triton":
            assert e.ops.backend == "triton"
    assert outs["triton"] == outs["reference"]
