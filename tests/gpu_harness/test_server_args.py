"""The GPU harness's server flags (sglang_replayssm.gpu_harness.gpu_server_args): its defaults are added unless given;
the overlap scheduler is turned off only for the no_buffer radix-cache strategy with the radix cache on, which SGLang
refuses with it."""

from sglang_replayssm.gpu_harness import GPU_DEFAULTS, gpu_server_args


def test_defaults_are_added_unless_given():
    out = gpu_server_args(["--model-path", "/m", "--attention-backend", "fa3"])
    assert out[:4] == ["--model-path", "/m", "--attention-backend", "fa3"]
    assert out.count("--attention-backend") == 1
    assert out[out.index("--mamba-radix-cache-strategy") + 1] == "no_buffer"
    assert "--disable-overlap-schedule" in out
    assert set(GPU_DEFAULTS) <= set(out)


def test_overlap_stays_on_with_a_strategy_other_than_no_buffer():
    for argv in (["--mamba-radix-cache-strategy", "extra_buffer"], ["--mamba-radix-cache-strategy=extra_buffer"]):
        out = gpu_server_args(argv)
        assert "--disable-overlap-schedule" not in out
        assert out.count("--mamba-radix-cache-strategy") + sum(a.startswith("--mamba-radix-cache-strategy=")
                                                               for a in out) == 1
    assert "--disable-overlap-schedule" in gpu_server_args(["--mamba-radix-cache-strategy", "no_buffer"])


def test_overlap_stays_on_without_the_radix_cache():
    """SGLang validates the strategy only while the radix cache is on: a server with --disable-radix-cache runs the
    overlap scheduler by default (NGRAM included), and so does the harness's."""
    for argv in (["--disable-radix-cache"], ["--disable-radix-cache", "--speculative-algorithm", "NGRAM"],
                 ["--disable-radix-cache", "--mamba-radix-cache-strategy", "no_buffer"]):
        assert "--disable-overlap-schedule" not in gpu_server_args(argv)
    out = gpu_server_args(["--disable-radix-cache", "--disable-overlap-schedule"])
    assert out.count("--disable-overlap-schedule") == 1
