"""Host time per step of the SGLang plugin's Python, measured on CPU: each plugin entry point (the metadata hook, each
layer's decode / verify / after-prefill hook, ``settle``, the commit) driven through SGLang's real backend classes as
``bench/plugin_op_counts.py`` drives them, with every Triton launch replaced by a no-op (and SGLang's conv-state
rollback at a commit, one fused kernel on CUDA and a chain of torch ops on CPU), so what is timed is the plugin's own
Python (argument checks, views, the kernels' wrappers) and the few torch ops it runs on tiny tensors, not the kernels.

Outside SGLang's CUDA graphs (an NGRAM or EAGLE verify, a prefill, a batch larger than the graphs) this Python runs
once per SSM layer per step on the host's critical path, before Triton's own launch overhead (not measured here: it
needs a GPU driver); at concurrency 1 it is most of a verify step's host time. Median over ``--reps`` steps, in µs per
call; ``per_step_us = step entries + layers x per_layer_us``.

    python bench/plugin_host_time.py [--families gdn mamba2] [--reps 300] [--out PATH]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")   # before Triton is imported (its launches are replaced below)

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import plugin_op_counts as opc  # noqa: E402


class HostTimer:
    """The op counter's Recorder interface (``entry``, ``installed``, ``take``), timing each entry's wall time instead,
    with Triton launches and SGLang's conv rollback made no-ops (``launches`` counts them)."""

    def __init__(self):
        self.calls: list[tuple[str, float]] = []
        self.launches = 0
        self._open = False

    @contextlib.contextmanager
    def entry(self, name: str):
        if self._open:   # an entry inside another is timed there
            yield
            return
        self._open = True
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.calls.append((name, time.perf_counter() - t0))
            self._open = False

    def installed(self):
        def no_launch(original, *args, **kwargs):
            self.launches += 1

        return opc.patched_entry_points(self, no_launch, no_launch)

    def take(self):
        calls, self.calls = self.calls, []
        return calls


def time_family(family: str, steps=opc.STEPS, reps: int = 300) -> dict:
    """Each step type ``reps`` times after two untimed runs; per entry the median µs per call."""
    T, runs = opc.DRAFTS, opc.STEP_RUNS
    out = {}
    timer = HostTimer()
    with timer.installed():
        for name in steps:
            topk, step = runs[name]
            with contextlib.ExitStack() as stack:
                h = opc.Harness(family, timer, T, topk, stack)
                h.decode()
                step(h)
                step(h)
                timer.take()
                samples: dict[str, list[float]] = {}
                launches = timer.launches
                for _ in range(reps):
                    for entry, dt in timer.take() or []:
                        samples.setdefault(entry, []).append(dt * 1e6)
                    step(h)
                for entry, dt in timer.take():
                    samples.setdefault(entry, []).append(dt * 1e6)
                launches = (timer.launches - launches) / reps
            per = {e: round(statistics.median(v), 2) for e, v in samples.items()}
            layer = per.get("layer", 0.0)
            out[name] = {"per_layer_us": layer, "entries_us": per, "launches_per_step": launches,
                         "per_step_us": round(sum(u for e, u in per.items() if e != "layer"), 2),
                         "step_at_36_layers_us": round(sum(u for e, u in per.items() if e != "layer") + 36 * layer, 1)}
    return out


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--families", nargs="+", default=["gdn", "mamba2"], choices=["gdn", "mamba2"])
    ap.add_argument("--steps", nargs="+", default=list(opc.STEPS), choices=opc.STEPS)
    ap.add_argument("--reps", type=int, default=300)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    os.environ["SGLANG_REPLAYSSM_OPS"] = "kernels"   # the pool's Triton wrappers, as on a GPU
    from tests.sglang_plugin.conftest import load_plugin

    load_plugin()
    torch.set_num_threads(1)
    res = {"command": "python bench/plugin_host_time.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "device": f"CPU: {_cpu_name()}, 1 torch thread", "time": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
           "torch": torch.__version__, "layers": len(opc.LAYERS), "batch": len(opc.SLOTS), "draft_tokens": 4,
           "note": "host µs per call of the plugin's Python (Triton launches made no-ops), median of the steps; "
                   "per_layer_us runs once per SSM layer per eager step",
           "families": {f: time_family(f, args.steps, args.reps) for f in args.families}}
    opc.emit(res, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
