"""bench/plugin_host_time.py times the plugin's own Python per entry point: a layer hook made slower by a known amount
shows in per_layer_us (and not in the step's other entries), and the Triton launches are reached but not run."""
import time

import pytest

from tests.bench_scripts import load_bench

pytestmark = pytest.mark.bench


def test_layer_time_is_the_layer_hooks_own(monkeypatch):
    from tests.sglang_plugin.conftest import load_plugin

    from sglang_replayssm.kernels import gdn as kgdn
    from sglang_replayssm.sglang_plugin.options import OPS_ENV

    monkeypatch.setenv(OPS_ENV, "kernels")
    load_plugin()
    bench = load_bench("plugin_host_time.py")
    base = bench.time_family("gdn", steps=("verify_tree",), reps=5)["verify_tree"]
    assert set(base["entries_us"]) == {"note_step", "layer", "settle", "commit"}, base
    assert 0 < base["per_layer_us"] < 2000, base
    assert base["launches_per_step"] >= 2 + 4, base   # per layer the verify kernel; the parents, the commit's
    verify = kgdn.verify

    def slow_verify(*args, **kwargs):
        time.sleep(0.003)
        return verify(*args, **kwargs)

    monkeypatch.setattr(kgdn, "verify", slow_verify)   # FamilyOps.triton takes the package's verify at pool creation
    slow = bench.time_family("gdn", steps=("verify_tree",), reps=5)["verify_tree"]
    assert slow["per_layer_us"] >= base["per_layer_us"] + 2900, (base, slow)
    assert slow["entries_us"]["commit"] < 2900, slow
