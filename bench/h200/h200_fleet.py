"""Issue 21, steps 2-3 on the H200: many SGLang servers on one GPU, greedy tokens, then bench_serving per server.

    python3 bench/h200/h200_fleet.py start  CKPT_DIR STATE_DIR   # start every server of SERVERS (setsid, staggered)
    python3 bench/h200/h200_fleet.py tokens STATE_DIR DEADLINE_S # wait for health, greedy tokens of each, compare
    python3 bench/h200/h200_fleet.py bench  STATE_DIR DEADLINE_S # bench_serving per server x concurrency (skips done rows)
    python3 bench/h200/h200_fleet.py report STATE_DIR OUT_DIR    # results.json (+ servers.log) into OUT_DIR
    python3 bench/h200/h200_fleet.py stop   STATE_DIR NAME...    # end the named servers (free the card)

Every server runs at once (CUDA graphs on), each with capped pools (``POOL_FLAGS``) so they share the
card; the servers are started a few seconds apart and left running (``setsid``) so that a later device
call on the same warm machine can go on benchmarking them. ``bench_serving`` runs one server at a time
(the others idle): SGLang's own ``sglang.benchmark.serving``, random dataset (its token source a local
ShareGPT-shaped file: the machine has no internet), fixed lengths (``--random-range-ratio 1``), request
rate inf, ``--max-concurrency`` 64 and 256. Each row's JSON line is kept in STATE_DIR/bench/.
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ENV = os.environ.get
MAX_RUNNING = int(ENV("FLEET_MAX_RUNNING", "256"))   # FLEET_MAX_RUNNING=128: full-depth servers share one card
GRAPH = ["--cuda-graph-max-bs-decode", str(MAX_RUNNING)]
POOL_FLAGS = ["--dtype", "bfloat16", "--mem-fraction-static", ENV("FLEET_MEM_FRACTION", "0.9"),
              "--max-running-requests", str(MAX_RUNNING),
              "--max-total-tokens", ENV("FLEET_TOTAL_TOKENS", "262144"),
              "--max-mamba-cache-size", str(MAX_RUNNING + 16),
              # random prompts share no prefix; without the radix cache SGLang keeps one mamba slot per request
              "--disable-radix-cache"]
RADIX = "RADIX"   # in a server's extra flags: keep the radix cache (drops --disable-radix-cache)
# in a server's extra flags: no fixed pool sizes (drops --max-total-tokens and --max-mamba-cache-size), so the server
# sizes its KV and mamba pools from --mem-fraction-static (FLEET_MEM_FRACTION: the same for every server, so they
# compare at equal memory) and its own price of a running request; the rows report what each reached
EQUAL_MEM = "EQUAL_MEM"
SIZED_FLAGS = ("--max-total-tokens", "--max-mamba-cache-size")
NGRAM = ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", "4"]
NGRAM_CHAIN = ["--speculative-ngram-max-bfs-breadth", "1"]
# issue 29: SGLANG_REPLAYSSM_SYNC_CHECK=1 makes any host sync in the plugin's step an error (sync_check.py); this
# server runs every plugin path a server reaches: decode, NGRAM tree verify + commit, extra_buffer track copies,
# radix-cache hits (copy_from), prefill flushes
SYNC_CHECK = {"SGLANG_REPLAYSSM_SYNC_CHECK": "1"}
SERVER_ENV: dict[str, dict] = {"gdn_ours_synccheck": SYNC_CHECK, "m2_ours_synccheck": SYNC_CHECK}
XBUF = [RADIX, "--mamba-radix-cache-strategy", "extra_buffer"]
# the "_fp32" servers read the fp32 checkpoint whatever the plugin's default (`auto`: fp8 on this GPU)
FP32_READ = ["--replayssm-read-copy", "none"]
# name -> (mode, model, extra flags); order = start order = bench order
SERVERS: dict[str, tuple[str, str, list[str]]] = {
    "gdn_stock": ("stock", "qwen3_next", []),
    "gdn_ours_fp32": ("plugin", "qwen3_next", FP32_READ),
    "gdn_sglang_replayssm": ("stock", "qwen3_next", ["--enable-linear-replayssm"]),
    "gdn_ours_fp8": ("plugin", "qwen3_next", ["--replayssm-read-copy", "fp8"]),
    "gdn_ours": ("plugin", "qwen3_next", []),   # the plugin's defaults (read copy auto: fp8 for GDN on this GPU)
    "m2_stock": ("stock", "nemotron_h", []),
    "m2_ours_fp32": ("plugin", "nemotron_h", FP32_READ),
    "m2_ours_fp8": ("plugin", "nemotron_h", ["--replayssm-read-copy", "fp8"]),
    "m2_ours": ("plugin", "nemotron_h", []),   # the plugin's defaults (read copy auto: fp8 on this GPU)
    "gdn_stock_ngram": ("stock", "qwen3_next", NGRAM),
    "gdn_ours_fp32_ngram": ("plugin", "qwen3_next", [*FP32_READ, *NGRAM]),
    # SGLang refuses --enable-linear-replayssm together with its spec variant (they share the ring)
    "gdn_sglang_replayssm_ngram": ("stock", "qwen3_next", ["--enable-linear-replayssm-spec", *NGRAM]),
    "gdn_ours_fp8_ngram": ("plugin", "qwen3_next", ["--replayssm-read-copy", "fp8", *NGRAM]),
    # NGRAM drafts as chains (BFS breadth 1, SGLang's eagle topk 1): the only drafts SGLang's RS-spec verify is exact
    # for (its chunked verify uses a causal mask; it refuses topk > 1, but NGRAM sets topk = its breadth, 10 by
    # default, after that check has run, so the trio above verifies trees with it)
    "gdn_stock_ngram_chain": ("stock", "qwen3_next", [*NGRAM, *NGRAM_CHAIN]),
    "gdn_sglang_replayssm_ngram_chain": ("stock", "qwen3_next", ["--enable-linear-replayssm-spec", *NGRAM,
                                                                 *NGRAM_CHAIN]),
    "gdn_ours_fp32_ngram_chain": ("plugin", "qwen3_next", [*FP32_READ, *NGRAM, *NGRAM_CHAIN]),
    # the sync check's mode is process-wide while a step runs: the overlap scheduler off (docs/sglang_on_gpu.md)
    "gdn_ours_synccheck": ("plugin", "qwen3_next", [*XBUF, *NGRAM, "--disable-overlap-schedule"]),
    "m2_ours_synccheck": ("plugin", "nemotron_h", [*XBUF, *NGRAM, "--disable-overlap-schedule"]),
    # the radix cache on, as a user serves by default: extra_buffer with the overlap scheduler for stock and ours;
    # SGLang's ReplaySSM refuses extra_buffer, and its no_buffer needs the overlap scheduler off (gpu_server_args)
    "gdn_stock_radix": ("stock", "qwen3_next", XBUF),
    "gdn_sglang_replayssm_radix": ("stock", "qwen3_next", ["--enable-linear-replayssm", RADIX]),
    "gdn_ours_fp32_radix": ("plugin", "qwen3_next", [*FP32_READ, *XBUF]),
    # issue 46: the radix cache on at equal memory, each server with SGLang's default strategy (stock: extra_buffer;
    # SGLang's ReplaySSM: no_buffer, the overlap scheduler off; ours: extra_buffer_lazy) and its own pool sizes
    "gdn_stock_eq": ("stock", "qwen3_next", [RADIX, EQUAL_MEM]),
    "gdn_sglang_replayssm_eq": ("stock", "qwen3_next", ["--enable-linear-replayssm", RADIX, EQUAL_MEM]),
    "gdn_ours_eq": ("plugin", "qwen3_next", [RADIX, EQUAL_MEM]),
    "gdn_ours_sr_eq": ("plugin", "qwen3_next", ["--replayssm-ckpt-precision", "fp16-sr", RADIX, EQUAL_MEM]),
}
ONLY = [s for s in os.environ.get("FLEET_ONLY", "").split(",") if s]
# stock-vs-other greedy comparisons: (reference, candidate); the NGRAM servers also against stock + NGRAM of their
# draft shape
PAIRS = [("gdn_stock", n) for n in SERVERS if n.startswith("gdn_") and n != "gdn_stock"] + \
        [("gdn_stock_ngram", n) for n in SERVERS if n.startswith("gdn_") and n.endswith("_ngram")
         and n != "gdn_stock_ngram"] + \
        [("gdn_stock_ngram_chain", n) for n in SERVERS if n.endswith("_ngram_chain") and n != "gdn_stock_ngram_chain"] + \
        [("m2_stock", n) for n in ("m2_ours_fp32", "m2_ours_fp8", "m2_ours")] + \
        [("gdn_sglang_replayssm", "gdn_ours_fp8"),   # where stock does not fit beside them (an H100)
         ("gdn_sglang_replayssm", "gdn_ours"),
         ("gdn_sglang_replayssm_ngram", "gdn_ours_fp32_ngram")] + \
        [("gdn_stock_eq", n) for n in SERVERS if n.endswith("_eq") and n != "gdn_stock_eq"]
CONCURRENCY = tuple(int(c) for c in ENV("FLEET_CONC", "64,256").split(","))
INPUT_LEN, OUTPUT_LEN = int(ENV("FLEET_IN", "512")), int(ENV("FLEET_OUT", "256"))
# FLEET_PROMPTS=1:12,64:256: prompts per concurrency (default: 3 per slot, 2 at 256)
PROMPTS_PER_CONC = {c: 3 * c for c in CONCURRENCY} | {256: 512} | \
    {int(k): int(v) for k, v in (x.split(":") for x in ENV("FLEET_PROMPTS", "").split(",") if x)}
# FLEET_ROUNDS=2: every row twice (files NAME_cC.jsonl, then NAME_cC_r2.jsonl), to show the run-to-run spread
ROUNDS = int(os.environ.get("FLEET_ROUNDS", "1"))
DATASET = ENV("FLEET_DATASET", "random")
if DATASET not in ("random", "shared-prefix"):
    raise SystemExit(f"FLEET_DATASET={DATASET!r}: random or shared-prefix")
GSP = tuple(int(v) for v in ENV("FLEET_GSP", "32:16:2048:128:256").split(":"))
if len(GSP) != 5:
    raise SystemExit("FLEET_GSP: groups:questions per group:shared prefix tokens:question tokens:output tokens")


def _servers():
    return {k: v for k, v in SERVERS.items() if not ONLY or k in ONLY}


def _state(state: Path) -> dict:
    p = state / "servers.json"
    return json.loads(p.read_text()) if p.exists() else {}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except OSError:
        return False


def server_flags(extra: list[str]) -> list[str]:
    """The pool and graph flags every server gets, then a server's own (RADIX: the radix cache stays on; EQUAL_MEM:
    no fixed pool sizes)."""
    pool_flags, i = [], 0
    while i < len(POOL_FLAGS):
        f = POOL_FLAGS[i]
        if EQUAL_MEM in extra and f in SIZED_FLAGS:
            i += 2
            continue
        if not (RADIX in extra and f == "--disable-radix-cache"):
            pool_flags.append(f)
        i += 1
    return [*pool_flags, *GRAPH, *[f for f in extra if f not in (RADIX, EQUAL_MEM)]]


def start(ckpt: Path, state: Path) -> None:
    state.mkdir(parents=True, exist_ok=True)
    st = _state(state)
    port = 30000 + len(st)
    for name, (mode, model, extra) in _servers().items():
        if name in st and _alive(st[name]["pid"]):
            continue
        argv = [sys.executable, str(HERE / "h200_serve.py"), mode, "--model-path", str(ckpt / model),
                "--host", "127.0.0.1", "--port", str(port), *server_flags(extra),
                *os.environ.get("FLEET_EXTRA", "").split()]
        log = open(state / f"{name}.log", "w")
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **SERVER_ENV.get(name, {})})
        st[name] = {"pid": proc.pid, "port": port, "argv": argv[1:], "started": time.time()}
        print(f"started {name} pid {proc.pid} port {port}: {' '.join(argv[2:])}", flush=True)
        (state / "servers.json").write_text(json.dumps(st, indent=1))
        port += 1
        time.sleep(float(os.environ.get("FLEET_STAGGER_S", "4")))   # pools are capped: no need to wait longer


def stop(state: Path, names: list[str]) -> None:
    """End the named servers this tool started (their process groups: setsid), to free the card for others."""
    import signal

    st = _state(state)
    for n in names:
        if n in st and _alive(st[n]["pid"]):
            os.killpg(st[n]["pid"], signal.SIGKILL)
            print(f"stopped {n} (pid {st[n]['pid']})", flush=True)


def _healthy(port: int) -> bool:
    import requests

    try:
        return requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
    except requests.RequestException:
        return False


def tokens(state: Path, deadline: float) -> None:
    sys.path.insert(0, str(HERE))
    import h200_query

    st = _state(state)
    todo = [n for n in st if n in _servers() and not (state / f"tok_{n}.json").exists()]
    while todo and time.time() < deadline:
        for n in list(todo):
            info = st[n]
            if not _alive(info["pid"]):
                print(f"{n}: server exited ({time.time() - info['started']:.0f}s after start)", flush=True)
                todo.remove(n)
            elif _healthy(info["port"]):
                ready = time.time() - info["started"]
                try:
                    h200_query.query(info["port"], str(state / f"tok_{n}.json"), info["pid"], timeout=30)
                    res = json.loads((state / f"tok_{n}.json").read_text())
                    res["ready_s"] = ready
                    (state / f"tok_{n}.json").write_text(json.dumps(res))
                    print(f"{n}: healthy {ready:.0f}s after start", flush=True)
                except Exception as e:   # noqa: BLE001 -- recorded, the fleet goes on
                    print(f"{n}: query failed: {e!r}", flush=True)
                todo.remove(n)
        time.sleep(2)
    for n in todo:
        print(f"{n}: not healthy by the deadline", flush=True)
    compare(state)


def compare(state: Path) -> None:
    lines = []
    for a, b in PAIRS:
        pa, pb = state / f"tok_{a}.json", state / f"tok_{b}.json"
        if not (pa.exists() and pb.exists()):
            continue
        ra, rb = json.loads(pa.read_text()), json.loads(pb.read_text())
        if "logprobs" in ra and "logprobs" in rb:
            sys.path.insert(0, str(HERE))
            import h200_query

            lines.append(f"{a} vs {b} logprobs: {json.dumps(h200_query.logprob_delta(ra['logprobs'], rb['logprobs']))}")
        for key in ("solo_ids", "batch_ids"):
            for i, (x, y) in enumerate(zip(ra[key], rb[key])):
                n = next((j for j, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
                lines.append(f"{a} vs {b} {key}[{i}]: " + ("EQUAL" if x == y else f"differ from token {n}")
                             + f" ({len(x)} tokens)")
    (state / "compare.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines), flush=True)


def _sharegpt(state: Path) -> Path:
    """A ShareGPT-shaped file for the random dataset's token source (varied English text, no download)."""
    p = state / "sharegpt_local.json"
    if not p.exists():
        text = (HERE / "h200_fleet.py").read_text() + (HERE / "h200_query.py").read_text()
        words = text.split()
        starts = [(k * 37) % (len(words) - 500) for k in range(2000)]   # more rows than any run's prompts
        convs = [{"conversations": [{"from": "human", "value": " ".join(words[i:i + 400])},
                                    {"from": "gpt", "value": " ".join(words[i + 400:i + 500])}]} for i in starts]
        p.write_text(json.dumps(convs))
    return p


def dataset_argv(conc: int, data: Path) -> list[str]:
    """bench_serving's dataset flags and prompt count: FLEET_DATASET=random (default: fixed lengths FLEET_IN /
    FLEET_OUT, PROMPTS_PER_CONC prompts) or shared-prefix (its generated-shared-prefix dataset, FLEET_GSP =
    groups:questions per group:shared prefix tokens:question tokens:output tokens, every group's questions sent;
    --cache-report: the rows carry the cached-token share)."""
    if DATASET == "random":
        return ["--dataset-name", "random", "--dataset-path", str(data), "--random-input-len", str(INPUT_LEN),
                "--random-output-len", str(OUTPUT_LEN), "--random-range-ratio", "1",
                "--num-prompts", str(PROMPTS_PER_CONC[conc])]
    groups, per_group, system, question, output = GSP
    return ["--dataset-name", "generated-shared-prefix", "--gsp-num-groups", str(groups), "--gsp-prompts-per-group",
            str(per_group), "--gsp-system-prompt-len", str(system), "--gsp-question-len", str(question),
            "--gsp-output-len", str(output), "--num-prompts", str(groups * per_group), "--cache-report"]


def row_stem(name: str, conc: int, rnd: int) -> str:
    """A bench row's file stem: NAME_cC, NAME_cC_rK for round K > 1; a shared-prefix row's NAME is the server's with
    _gsp (bench/sglang_h200_fleet.py reads it as a server of its own)."""
    return f"{name}{'_gsp' if DATASET == 'shared-prefix' else ''}_c{conc}" + (f"_r{rnd}" if rnd > 1 else "")


def _bench_argv(info: dict, name: str, conc: int, data: Path, row: Path, seed: int) -> list[str]:
    """bench_serving's flags for one row; `seed` picks its prompts (the round: a second round sends new prompts, so
    an NGRAM server's corpus has not seen them, and every server of a round gets the same ones)."""
    model = info["argv"][3]
    return ["--backend", "sglang", "--host", "127.0.0.1", "--port", str(info["port"]), "--model", model,
            "--tokenizer", model, *dataset_argv(conc, data), "--request-rate", "inf", "--max-concurrency", str(conc),
            "--tokenize-prompt", "--warmup-requests", "4", "--disable-tqdm", "--seed", str(seed), "--tag", name,
            "--output-file", str(row)]


def bench(state: Path, deadline: float) -> None:
    """Every row not done yet, one server at a time, in one child process (SGLang imported once)."""
    st = _state(state)
    out = state / "bench"
    out.mkdir(exist_ok=True)
    starting = [n for n in st if _alive(st[n]["pid"]) and not _healthy(st[n]["port"])]
    for n in starting:   # too late: their start-up (JIT, graph capture) would share the GPU with the benchmark
        print(f"bench: {n} still starting {time.time() - st[n]['started']:.0f}s after start: stopped", flush=True)
        import signal
        os.killpg(st[n]["pid"], signal.SIGKILL)
    time.sleep(2 if starting else 0)
    data = _sharegpt(state)
    rows = []
    live = [n for n in _servers() if n in st and _alive(st[n]["pid"])]
    # round by round, each concurrency across every server in turn: a drift of the machine over the run
    # (clocks, the other servers' idle loops) falls on every server alike
    for rnd in range(1, ROUNDS + 1):
        for conc in CONCURRENCY:
            for n in live:
                row = out / (row_stem(n, conc, rnd) + ".jsonl")
                if not (row.exists() and row.stat().st_size):
                    rows.append([n, conc, str(row), _bench_argv(st[n], n, conc, data, row, rnd)])
    if not rows:
        return
    (out / "rows.json").write_text(json.dumps(rows))
    sys.path.insert(0, str(HERE.parents[2]))   # the source root (bench/h200/../..)
    from sglang_replayssm import gpu_harness

    with open(out / "rows.log", "a") as log:
        try:
            subprocess.run([sys.executable, __file__, "bench-rows", str(out / "rows.json"), str(deadline)],
                           stdout=log, stderr=subprocess.STDOUT, env=gpu_harness.harness_env(),
                           timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            print("bench: deadline reached", flush=True)
    for n, conc, row, _ in rows:
        print(f"bench {Path(row).stem}: " + _row_summary(Path(row)), flush=True)


def bench_rows(rows_path: Path, deadline: float) -> None:
    """(child) SGLang's bench_serving CLI for each row, in this one process, until the deadline."""
    sys.path.insert(0, str(HERE.parents[2]))   # the source root (bench/h200/../..)
    from sglang_replayssm import gpu_harness

    gpu_harness.activate()
    from sglang.benchmark import serving

    for name, conc, row, argv in json.loads(rows_path.read_text()):
        if deadline - time.time() < 40:
            print(f"row {name} c{conc}: {deadline - time.time():.0f}s left, stopped", flush=True)
            return
        t0 = time.time()
        print(f"===== row {name} c{conc}", flush=True)
        sys.argv = ["bench_serving", *argv]
        try:
            serving.cli_main()
        except BaseException as e:   # noqa: BLE001 -- one failed row must not stop the others
            print(f"row {name} c{conc} failed: {e!r}", flush=True)
        print(f"row {name} c{conc}: {time.time() - t0:.0f}s", flush=True)
        if os.environ.get("OUT"):   # the rows so far reach the device call's output even if the call is cut
            report(rows_path.parents[1], Path(os.environ["OUT"]))


def _row_summary(row: Path) -> str:
    if not row.exists() or not row.stat().st_size:
        return "(no result)"
    r = json.loads(row.read_text().strip().splitlines()[-1])
    return (f"out {r.get('output_throughput', 0):.0f} tok/s, median ITL {r.get('median_itl_ms', 0):.2f} ms, "
            f"median TPOT {r.get('median_tpot_ms', 0):.2f} ms, accept {r.get('accept_length')}")


# what each server actually ran with (GET /get_server_info after start, not the argv before the harness's defaults)
SERVER_INFO_KEYS = ("mamba_radix_cache_strategy", "disable_overlap_schedule", "disable_radix_cache", "page_size",
                    "max_running_requests", "max_total_num_tokens", "max_mamba_cache_size", "mem_fraction_static",
                    "mamba_track_interval", "speculative_algorithm", "speculative_num_draft_tokens", "version")


def server_info(port: int) -> dict | None:
    """The effective settings of a live server (SERVER_INFO_KEYS of its /get_server_info), None if it does not
    answer."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/get_server_info", timeout=10) as r:
            info = json.loads(r.read())
    except (OSError, ValueError):
        return None
    flat = {**info, **(info.get("internal_states") or [{}])[0]} if isinstance(info, dict) else {}
    return {k: flat[k] for k in SERVER_INFO_KEYS if k in flat}


def report(state: Path, out: Path) -> None:
    st = _state(state)
    res = {"servers": {}, "bench": {}, "compare": (state / "compare.txt").read_text()
           if (state / "compare.txt").exists() else ""}
    for n, info in st.items():
        tok = state / f"tok_{n}.json"
        alive = _alive(info["pid"])
        res["servers"][n] = {"argv": info["argv"], "alive": alive,
                             "tokens": json.loads(tok.read_text()) if tok.exists() else None,
                             "server_info": server_info(info["port"]) if alive else None}
    for row in sorted(glob.glob(str(state / "bench" / "*.jsonl"))):
        lines = Path(row).read_text().strip().splitlines()
        if lines:
            res["bench"][Path(row).stem] = json.loads(lines[-1])
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1))
    # the servers' errors and kernel resolutions, and each log's tail
    with open(out / "servers.log", "w") as f:
        for n in st:
            text = (state / f"{n}.log").read_text(errors="replace").splitlines()
            keep = [ln for ln in text if any(w in ln for w in ("Error", "error", "Traceback", "gpu-harness",
                                                                "ReplaySSM", "KV Cache", "Capture", "capture",
                                                                "Post-capture", "max_running", "amba", "Memory pool",
                                                                "avail mem"))]
            f.write(f"===== {n} ({len(text)} lines)\n" + "\n".join(dict.fromkeys(keep))[-6000:] + "\n--- tail\n"
                    + "\n".join(text[-25:]) + "\n")
        blog = state / "bench" / "rows.log"
        if blog.exists():
            f.write("===== bench rows.log\n" + "\n".join(blog.read_text(errors="replace").splitlines()[-400:]) + "\n")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "start":
        start(Path(args[0]), Path(args[1]))
    elif cmd == "tokens":
        tokens(Path(args[0]), time.time() + float(args[1]))
    elif cmd == "bench":
        bench(Path(args[0]), time.time() + float(args[1]))
    elif cmd == "bench-rows":
        bench_rows(Path(args[0]), float(args[1]))
    elif cmd == "stop":
        stop(Path(args[0]), args[1:])
    elif cmd == "report":
        report(Path(args[0]), Path(args[1]))
    else:
        sys.exit(__doc__)
