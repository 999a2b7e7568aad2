"""Issue 29, item 1: a torch-profiler trace of a running SGLang server's steps under load, summarized.

    python3 bench/h200/h200_profile.py capture PORT NAME OUT_DIR [--conc 128] [--in 1024] [--out 256]
                                               [--steps 6] [--stack] [--prof-dir /tmp/prof]
    python3 bench/h200/h200_profile.py summarize TRACE.json.gz          # the summary as JSON on stdout

``capture`` puts ``--conc`` clients on the server, each sending requests of ``--in`` prompt ids (greedy, EOS
ignored) one after the other, waits until their prefills are done (the server's running batch at ``--conc``,
read from ``/metrics``: start the server with ``--enable-metrics``; else a fixed wait), asks SGLang's own profiler (``POST /start_profile``: CPU + GPU activities, ``num_steps``
steps, python stacks with ``--stack``) for a trace of the next steps, aborts the load (``/abort_request``) and
writes ``OUT_DIR/NAME.summary.json`` (the trace itself stays on the machine: tens of MB).

The summary (``summarize``), over the window from the first to the last GPU activity of the trace:

* ``step_ms``: the window over the number of steps profiled; ``gpu_busy``: the share of the window with any
  kernel, copy or memset running (intervals merged over streams); ``gaps``: the GPU's idle intervals of more
  than 20 us (count, total, the five largest);
* ``syncs``: every host call that waits for the device (``cudaStreamSynchronize``, ``cudaDeviceSynchronize``,
  ``cudaEventSynchronize``, and the ``cudaMemcpy*`` whose GPU side is a device-to-host copy), counted by where
  it comes from: the innermost python frames (``--stack``) or else the innermost torch op around it;
* ``launches``: kernel and graph launches by call; ``launches_where``: the eager ones (not ``cudaGraphLaunch``) by
  where they come from, as for ``syncs``;
* ``kernels``: GPU time by class (the SSM and short-conv kernels, attention, MoE, GEMM, copies, other; by
  kernel name, ``KERNEL_CLASSES``) and the 15 kernels of most GPU time.
"""

from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import sys
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
GAP_US = 20.0
LAUNCH_CALLS = ("cudaLaunchKernel", "cudaGraphLaunch", "cuLaunchKernel", "cuLaunchKernelEx")
SKIP_FRAMES = ("<built-in", "torch/", "threading.py", "contextlib.py", "sync_check.py")   # frames that say nothing
# (class, pattern on the kernel name), first match wins
KERNEL_CLASSES = (
    ("copy", re.compile(r"^Memcpy|^Memset|memcpy|memset", re.I)),
    ("ssm", re.compile(r"gdn|gated_delta|delta_rule|recurrent|_kda|kda_|_m2_|mamba|selective_state|ssd|_chunk_|"
                       r"replay|fold|ring|conv1d|conv_roll|causal_conv|_advance_kernel|_compact_kernel|_copy_rows|"
                       r"_flush_list|scatter_speculative|l2norm", re.I)),
    ("attention", re.compile(r"flash|fmha|attn|attention|decode_grouped|extend_|merge_state|^_fwd_", re.I)),
    ("moe", re.compile(r"moe|expert|topk|align_block", re.I)),
    ("gemm", re.compile(r"gemm|gemv|cutlass|xmma|nvjet|cublas|sm90_|matmul|splitk", re.I)),
)


def kernel_class(name: str) -> str:
    return next((c for c, pat in KERNEL_CLASSES if pat.search(name)), "other")


def _merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    out: list[list[float]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return [(s, e) for s, e in out]


def _where(ev: dict, frames: dict, key) -> str:
    """The innermost enclosing python frames (else torch ops) of ``ev`` on its thread."""
    starts, spans = frames.get(key, ([], []))
    i = bisect.bisect_right(starts, ev["ts"])
    inside = [sp for sp in spans[:i] if sp[0] <= ev["ts"] and ev["ts"] + ev.get("dur", 0) <= sp[1]]
    inside.sort(key=lambda sp: sp[1] - sp[0])   # innermost first
    names = [sp[2] for sp in inside if not any(w in sp[2] for w in SKIP_FRAMES)][:3]
    return " < ".join(names) if names else "(no enclosing frame)"


def summarize(trace: dict, steps: int | None = None) -> dict:
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X" and "dur" in e]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not gpu:
        return {"error": "no GPU activity in the trace"}
    lo = min(e["ts"] for e in gpu)
    hi = max(e["ts"] + e["dur"] for e in gpu)
    window = hi - lo
    busy_iv = _merge([(e["ts"], e["ts"] + e["dur"]) for e in gpu])
    busy = sum(e - s for s, e in busy_iv)
    gaps = sorted((busy_iv[i + 1][0] - busy_iv[i][1] for i in range(len(busy_iv) - 1)), reverse=True)
    gaps = [g for g in gaps if g > GAP_US]
    # host frames by thread: python functions (with_stack) first, else torch ops
    frames: dict = {}
    spans_by = defaultdict(list)
    py = [e for e in events if e.get("cat") == "python_function"]
    for e in py or [e for e in events if e.get("cat") == "cpu_op"]:
        spans_by[(e.get("pid"), e.get("tid"))].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for key, spans in spans_by.items():
        spans.sort()
        frames[key] = ([s[0] for s in spans], spans)
    d2h = {e.get("args", {}).get("correlation") for e in gpu
           if e.get("cat") == "gpu_memcpy" and ("DtoH" in e["name"] or "Device -> Pageable" in e["name"]
                                                  or "Device -> Pinned" in e["name"])}
    d2h.discard(None)
    syncs: Counter = Counter()
    sync_us = 0.0
    for e in events:
        if e.get("cat") != "cuda_runtime":
            continue
        name = e["name"]
        if name in SYNC_CALLS or (name.startswith("cudaMemcpy") and e.get("args", {}).get("correlation") in d2h):
            syncs[f"{name} @ {_where(e, frames, (e.get('pid'), e.get('tid')))}"] += 1
            sync_us += e["dur"]
    launch_ev = [e for e in events if e.get("cat") in ("cuda_runtime", "cuda_driver") and e["name"] in LAUNCH_CALLS]
    launches = Counter(e["name"] for e in launch_ev)
    # where the eager launches (outside a graph) come from: with --stack the innermost python frames
    launch_where = Counter(_where(e, frames, (e.get("pid"), e.get("tid")))
                           for e in launch_ev if e["name"] != "cudaGraphLaunch")
    by_class: Counter = Counter()
    by_kernel: Counter = Counter()
    count: Counter = Counter()
    for e in gpu:
        by_class[kernel_class(e["name"])] += e["dur"]
        by_kernel[e["name"][:120]] += e["dur"]
        count[e["name"][:120]] += 1
    n = steps or max(1, launches.get("cudaGraphLaunch", 0))
    return {
        "window_ms": window / 1e3, "steps": n, "step_ms": window / 1e3 / n,
        "gpu_busy": busy / window if window else 0.0,
        "gaps": {"count": len(gaps), "total_ms": sum(gaps) / 1e3, "largest_us": [round(g, 1) for g in gaps[:5]]},
        "syncs": {"count": sum(syncs.values()), "host_ms": sync_us / 1e3, "where": dict(syncs.most_common(20))},
        "launches": dict(launches),
        "launches_where": dict(launch_where.most_common(25)),
        "kernels": {"busy_ms": busy / 1e3,
                    "share_of_busy": {c: round(t / max(busy, 1e-9), 4) for c, t in by_class.most_common()},
                    "top": [{"name": k, "ms": round(t / 1e3, 3), "calls": count[k]}
                            for k, t in by_kernel.most_common(15)]},
    }


def _load(path: Path) -> dict:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def _running(base: str) -> float | None:
    import requests

    try:
        text = requests.get(base + "/metrics", timeout=5).text
    except requests.RequestException:
        return None
    m = re.search(r"^sglang:num_running_reqs\{[^}]*\}\s+([0-9.e+]+)", text, re.M)
    return float(m.group(1)) if m else None


def capture(port: int, name: str, out: Path, conc: int, in_len: int, out_len: int, steps: int, stack: bool,
            prof_dir: Path) -> dict:
    import requests

    base = f"http://127.0.0.1:{port}"
    ids = [[(7 * i + 13 * j) % 500 + 3 for j in range(in_len)] for i in range(conc)]

    stop = threading.Event()

    def one(i: int) -> None:   # one client: a request after the other until the trace is written (a load that
        while not stop.is_set():   # ended before ``num_steps`` steps would leave the profiler waiting for steps)
            try:
                requests.post(base + "/generate", json={"input_ids": ids[i], "sampling_params": {
                    "temperature": 0, "max_new_tokens": out_len, "ignore_eos": True}}, timeout=600)
            except requests.RequestException:
                pass

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(conc)]
    t0 = time.time()
    for t in threads:
        t.start()
    while time.time() - t0 < 60:   # prefills done: every request running (or, without metrics, a fixed wait)
        r = _running(base)
        if (r is not None and r >= conc) or (r is None and time.time() - t0 > 15):
            break
        time.sleep(0.5)
    time.sleep(1.0)
    running = _running(base)
    pdir = prof_dir / name
    pdir.mkdir(parents=True, exist_ok=True)
    req = {"output_dir": str(pdir), "num_steps": steps, "activities": ["CPU", "GPU"], "with_stack": stack,
           "record_shapes": False, "profile_id": name}
    requests.post(base + "/start_profile", json=req, timeout=60).raise_for_status()
    trace = None
    while time.time() - t0 < 240 and trace is None:
        found = sorted(pdir.glob(f"{name}*.trace.json.gz"))
        if found:
            time.sleep(1.0)   # let the writer finish
            trace = found[0]
        time.sleep(0.5)
    stop.set()
    requests.post(base + "/abort_request", json={"abort_all": True}, timeout=30)
    for t in threads:
        t.join(timeout=30)
    res = {"name": name, "conc": conc, "in": in_len, "steps_asked": steps, "with_stack": stack,
           "running_at_start": running}
    if trace is None:
        res["error"] = "no trace written"
    else:
        try:
            res.update(summarize(_load(trace), steps))
            res["trace_mb"] = trace.stat().st_size / 2**20
        except Exception as e:   # noqa: BLE001 -- recorded in the summary
            res["error"] = repr(e)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.summary.json").write_text(json.dumps(res, indent=1))
    print(f"profile {name}: " + json.dumps({k: res.get(k) for k in ("step_ms", "gpu_busy", "error")})
          + f" syncs {res.get('syncs', {}).get('count')}", flush=True)
    return res


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("port", type=int)
    c.add_argument("name")
    c.add_argument("out", type=Path)
    c.add_argument("--conc", type=int, default=128)
    c.add_argument("--in", dest="in_len", type=int, default=1024)
    c.add_argument("--out", dest="out_len", type=int, default=256)
    c.add_argument("--steps", type=int, default=6)
    c.add_argument("--stack", action="store_true")
    c.add_argument("--prof-dir", type=Path, default=Path("/tmp/prof"))
    s = sub.add_parser("summarize")
    s.add_argument("trace", type=Path)
    s.add_argument("--steps", type=int)
    a = p.parse_args(argv)
    if a.cmd == "capture":
        capture(a.port, a.name, a.out, a.conc, a.in_len, a.out_len, a.steps, a.stack, a.prof_dir)
    else:
        json.dump(summarize(_load(a.trace), a.steps), sys.stdout, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
