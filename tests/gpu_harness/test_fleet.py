"""The H200 fleet's bookkeeping (bench/h200/h200_fleet.py, bench/sglang_h200_fleet.py), on made-up results.

The greedy-token comparison names the first differing token of each prompt against the stock server of the
same family; the gatherer keeps every bench row's metrics and writes JSON + PNG; the local ShareGPT-shaped
file has more rows than any run's prompts (the random dataset stops at the file's end).
"""

import importlib.util
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


fleet = _load(ROOT / "bench" / "h200" / "h200_fleet.py", "h200_fleet")
gather = _load(ROOT / "bench" / "sglang_h200_fleet.py", "sglang_h200_fleet")

STOCK = [[1, 2, 3, 4], [5, 6, 7, 8]]
OURS = [[1, 2, 9, 4], [5, 6, 7, 8]]


def _state(tmp_path: Path) -> Path:
    st = {n: {"pid": 2 ** 22 + i, "port": 1, "argv": ["serve.py", mode, "--model-path", "/m"], "started": 0}
          for i, (n, mode) in enumerate((("m2_stock", "stock"), ("m2_ours_fp32", "plugin")))}
    (tmp_path / "servers.json").write_text(json.dumps(st))
    for n, ids in (("m2_stock", STOCK), ("m2_ours_fp32", OURS)):
        (tmp_path / f"tok_{n}.json").write_text(json.dumps({"solo_ids": ids, "batch_ids": ids, "ready_s": 5}))
        (tmp_path / f"{n}.log").write_text("Traceback: x\nlast line\n")
    (tmp_path / "bench").mkdir()
    for row, tput in (("m2_stock_c64", 1000.0), ("m2_stock_c64_r2", 1200.0)):
        (tmp_path / "bench" / f"{row}.jsonl").write_text(json.dumps(
            {"output_throughput": tput, "median_itl_ms": 5.0, "p99_itl_ms": 9.0, "median_tpot_ms": 4.0,
             "duration": 3.0, "accept_length": None}) + "\n")
    return tmp_path


def test_compare_names_first_differing_token(tmp_path, monkeypatch):
    monkeypatch.setattr(fleet, "PAIRS", [("m2_stock", "m2_ours_fp32")])
    fleet.compare(_state(tmp_path))
    lines = (tmp_path / "compare.txt").read_text().splitlines()
    assert "m2_stock vs m2_ours_fp32 solo_ids[0]: differ from token 2 (4 tokens)" in lines
    assert "m2_stock vs m2_ours_fp32 solo_ids[1]: EQUAL (4 tokens)" in lines


def test_report_and_gather(tmp_path):
    (tmp_path / "state").mkdir()
    state = _state(tmp_path / "state")
    fleet.report(state, tmp_path / "out")
    res = json.loads((tmp_path / "out" / "results.json").read_text())
    assert res["bench"]["m2_stock_c64"]["output_throughput"] == 1000.0
    assert "last line" in (tmp_path / "out" / "servers.log").read_text()
    gather.main(["--out", str(tmp_path / "fleet"), "--call", f"x={tmp_path / 'out' / 'results.json'}"])
    data = json.loads((tmp_path / "fleet.json").read_text())
    assert data["calls"]["x"]["stock_vs_other"]["m2_stock vs m2_ours_fp32"] == {"solo_ids": [2, None],
                                                                                "batch_ids": [2, None]}
    assert data["calls"]["x"]["bench"]["m2_stock_c64"]["median_itl_ms"] == 5.0
    assert (tmp_path / "fleet.png").stat().st_size > 1000
    # one table row per (server, concurrency), each round's value in order
    assert "| x | m2_stock | 64 | 1000 / 1200 | 5.00 / 5.00 |" in gather.table(data["calls"])


def test_row_names_and_rounds():
    assert gather.parse_row("gdn_ours_fp8_ngram_c256") == ("gdn_ours_fp8_ngram", 256, 1)
    assert gather.parse_row("gdn_stock_c64_r2") == ("gdn_stock", 64, 2)
    try:
        gather.parse_row("gdn_stock")
    except ValueError as e:
        assert "gdn_stock" in str(e)
    else:
        raise AssertionError("a name without _cC must be refused")


def test_bench_rounds_interleave_servers(tmp_path, monkeypatch):
    """Rows run round by round, each concurrency across every server, and a row already done is skipped."""
    st = {n: {"pid": os.getpid(), "port": 1, "argv": ["serve.py", "stock", "--model-path", "/m"], "started": 0}
          for n in ("gdn_stock", "gdn_ours_fp32")}
    (tmp_path / "servers.json").write_text(json.dumps(st))
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "gdn_stock_c64.jsonl").write_text("{}\n")
    monkeypatch.setattr(fleet, "ROUNDS", 2)
    monkeypatch.setattr(fleet, "ONLY", [])
    monkeypatch.setattr(fleet, "SERVERS", {n: ("stock", "qwen3_next", []) for n in st})
    monkeypatch.setattr(fleet, "_healthy", lambda port: True)
    monkeypatch.setattr(fleet.subprocess, "run", lambda *a, **k: None)   # the bench child: rows.json is the plan
    fleet.bench(tmp_path, 0.0)
    rows = [Path(r[2]).stem for r in json.loads((tmp_path / "bench" / "rows.json").read_text())]
    assert rows == ["gdn_ours_fp32_c64", "gdn_stock_c256", "gdn_ours_fp32_c256", "gdn_stock_c64_r2",
                    "gdn_ours_fp32_c64_r2", "gdn_stock_c256_r2", "gdn_ours_fp32_c256_r2"]


def test_sharegpt_file_outlasts_the_prompts(tmp_path):
    rows = json.loads(fleet._sharegpt(tmp_path).read_text())
    assert len(rows) > max(fleet.PROMPTS_PER_CONC.values()) + 8
    assert all(len(r["conversations"]) == 2 and r["conversations"][0]["value"] for r in rows)


def _top(prompt_rows):
    return [{str(t): lp for t, lp in row} for row in prompt_rows]


def test_logprob_deltas_reach_the_gathered_json(tmp_path, monkeypatch):
    """Two servers' top-5 logprobs: the largest |difference| of the tokens both list, over the prefill and over the
    decode positions up to the first differing output token (included: same text before it); the fleet's compare
    line carries it into the gathered JSON."""
    query = sys.modules["h200_query"] if "h200_query" in sys.modules else _load(
        ROOT / "bench" / "h200" / "h200_query.py", "h200_query")
    a = {"prompts": [{"ids": [7, 8, 9], "input_top": _top([[(1, -0.5), (2, -1.0)]]),
                      "output_top": _top([[(7, -0.1), (3, -2.0)], [(8, -0.2)], [(9, -0.3)]])}]}
    b = {"prompts": [{"ids": [7, 5, 9], "input_top": _top([[(1, -0.75), (4, -1.0)]]),
                      "output_top": _top([[(7, -0.1), (3, -2.5)], [(5, -0.4), (8, -1.0)], [(9, -9.0)]])}]}
    d = query.logprob_delta(a, b)
    assert d == {"prefill_max_abs": 0.25, "decode_max_abs": 0.8, "decode_positions_compared": 1}
    monkeypatch.setattr(fleet, "PAIRS", [("m2_stock", "m2_ours_fp32")])
    state = _state(tmp_path / "state") if (tmp_path / "state").mkdir() is None else None
    for n, lp in (("m2_stock", a), ("m2_ours_fp32", b)):
        tok = json.loads((state / f"tok_{n}.json").read_text())
        (state / f"tok_{n}.json").write_text(json.dumps(dict(tok, logprobs=lp)))
    fleet.compare(state)
    fleet.report(state, tmp_path / "out")
    prof = tmp_path / "profiles.json"
    prof.write_text(json.dumps({"m2_stock": {"step_ms": 12.5}}))
    gather.main(["--out", str(tmp_path / "fleet"), "--call", f"x={tmp_path / 'out' / 'results.json'}",
                 "--profiles", str(prof)])
    data = json.loads((tmp_path / "fleet.json").read_text())
    assert data["calls"]["x"]["logprobs"] == {"m2_stock vs m2_ours_fp32": d}
    assert data["profiles"] == {"m2_stock": {"step_ms": 12.5}}


def test_every_fleet_server_parses_with_sglangs_own_parser():
    """Each server of the H200 fleet, as h200_serve.py starts it (the harness's GPU defaults added), parses with
    SGLang 0.5.23's own argument parser and ours: a misspelt flag fails here, not after a device machine's start."""
    import argparse

    import pytest

    pytest.importorskip("sglang")
    from sglang.srt.server_args import ServerArgs

    from sglang_replayssm.flags import ReplaySSMOptions, add_replayssm_args, split_argv
    from sglang_replayssm.gpu_harness import gpu_server_args

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ours_parser = argparse.ArgumentParser()
    add_replayssm_args(ours_parser)
    for name, (mode, model, extra) in fleet.SERVERS.items():
        argv = ["--model-path", f"/m/{model}", *fleet.server_flags(extra)]
        assert ("--disable-radix-cache" in argv) == (fleet.RADIX not in extra), name
        ours, rest = split_argv(gpu_server_args(argv))
        assert mode == "plugin" or not ours, f"{name}: ReplaySSM flags on a stock server: {ours}"
        ReplaySSMOptions.from_args(ours_parser.parse_args(ours))
        args = parser.parse_args(rest)
        assert args.model_path == f"/m/{model}", name
        if "--speculative-ngram-max-bfs-breadth" in extra:
            assert args.speculative_ngram_max_bfs_breadth == 1, name


def test_equal_memory_servers_size_their_own_pools():
    """EQUAL_MEM drops the fixed pool sizes (each server sizes its pools from --mem-fraction-static), RADIX keeps
    the radix cache; the other pool flags stay, and neither marker reaches SGLang's command line."""
    flags = fleet.server_flags([fleet.RADIX, fleet.EQUAL_MEM, "--enable-linear-replayssm"])
    for gone in ("--max-total-tokens", "--max-mamba-cache-size", "--disable-radix-cache", fleet.RADIX,
                 fleet.EQUAL_MEM):
        assert gone not in flags, flags
    assert flags[flags.index("--mem-fraction-static") + 1] == fleet.ENV("FLEET_MEM_FRACTION", "0.9")
    assert "--max-running-requests" in flags and flags[-1] == "--enable-linear-replayssm"
    fixed = fleet.server_flags([])
    assert "--max-mamba-cache-size" in fixed and "--disable-radix-cache" in fixed
    # a fixed size's value went with its flag: every flag is still followed by its own value
    assert flags[flags.index("--max-running-requests") + 1] == str(fleet.MAX_RUNNING)


def test_shared_prefix_rows(monkeypatch, tmp_path):
    """FLEET_DATASET=shared-prefix: bench_serving's generated-shared-prefix, every group's questions sent, the cache
    report on, rows named NAME_gsp_cC (their own server in the gatherer's table)."""
    monkeypatch.setattr(fleet, "DATASET", "shared-prefix")
    monkeypatch.setattr(fleet, "GSP", (32, 16, 2048, 128, 256))
    info = {"port": 30001, "argv": ["serve.py", "plugin", "--model-path", "/m"]}
    argv = fleet._bench_argv(info, "gdn_ours_eq", 64, tmp_path / "data.json", tmp_path / "row.jsonl", 1)
    at = lambda f: argv[argv.index(f) + 1]   # noqa: E731
    assert at("--dataset-name") == "generated-shared-prefix" and at("--num-prompts") == "512"
    assert (at("--gsp-system-prompt-len"), at("--gsp-output-len"), at("--max-concurrency")) == ("2048", "256", "64")
    assert "--cache-report" in argv and "--random-input-len" not in argv
    assert fleet.row_stem("gdn_ours_eq", 64, 2) == "gdn_ours_eq_gsp_c64_r2"
    assert gather.parse_row(fleet.row_stem("gdn_ours_eq", 128, 1)) == ("gdn_ours_eq_gsp", 128, 1)
    monkeypatch.setattr(fleet, "DATASET", "random")
    assert fleet.row_stem("gdn_ours_eq", 64, 1) == "gdn_ours_eq_c64"
