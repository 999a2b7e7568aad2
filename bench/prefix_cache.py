"""Prefix caching under ReplaySSM in real SGLang: ``--mamba-radix-cache-strategy extra_buffer`` vs ``no_buffer``.

Starts the real SGLang 0.5.23 server with the plugin (window 16) twice on the CPU harness, one strategy at a
time, and sends the same shared-prefix workload to each:

* few-shot: one long prefix (system prompt + examples), then different questions, one after another;
* forks: one conversation, then branches of it sent at once;
* multi-turn chat: each turn extends the previous turn and its answer.

Per request it records the prompt tokens, the tokens served from the radix cache (``cached_tokens``) and the
time to the first streamed token; the JSON has every request and the per-workload sums. ``no_buffer`` runs as
SGLang requires it (pages of 1, no overlap scheduler); ``extra_buffer`` with pages of 16 and the overlap
scheduler, tracking every 64 tokens. Both servers answer greedily; the run fails if their answers differ.

    python bench/prefix_cache.py --model-dir /tmp/tiny --out bench/results/prefix_cache_cpu.json

(``python -m sglang_replayssm.cpu_harness.tiny_checkpoints /tmp/tiny`` writes the tiny Qwen3-Next checkpoint.)
On this CPU only the ratios mean something: prefill tokens saved is exact; TTFT is CPU prefill time.

``--native`` sends the same workload to the native engine in process (the built-in model) with its prefix cache
on a grid of 64 tokens and with one state per prompt, and writes ``bench/results/prefix_cache_native_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import requests

SYSTEM = ("You are a careful assistant. Answer briefly and precisely; when a question is unclear, say so and ask "
          "for the missing detail. Prefer short sentences, and never invent facts.\n")
EXAMPLES = "".join(f"Q: {a} + {b}?\nA: {a + b}\n" for a, b in ((2, 2), (3, 5), (10, 4), (7, 9), (12, 30), (8, 8)))
QUESTIONS = ("Q: 6 + 9?\nA:", "Q: 12 + 4?\nA:", "Q: 1 + 1?\nA:", "Q: 20 + 22?\nA:", "Q: 5 + 0?\nA:",
             "Q: 9 + 9?\nA:")
NEW_TOKENS = 8

STRATEGIES = {
    "no_buffer": (["--mamba-radix-cache-strategy", "no_buffer"], {}),
    "extra_buffer": (["--mamba-radix-cache-strategy", "extra_buffer", "--page-size", "16", "--mamba-track-interval",
                      "64"], {"SGLANG_REPLAYSSM_CPU_OVERLAP": "1"}),
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One SGLang server (our launcher, CPU harness) on 127.0.0.1; stopped by its own process group."""

    def __init__(self, model: Path, extra: list[str], env: dict, log: Path):
        import transformers

        self.tokenizer = transformers.AutoTokenizer.from_pretrained(model)
        self.url = f"http://127.0.0.1:{_port()}"
        cmd = [sys.executable, "-m", "sglang_replayssm.launch", "--engine", "sglang", "--device", "cpu",
               "--model-path", str(model), "--host", "127.0.0.1", "--port", self.url.rsplit(":", 1)[1],
               "--replayssm-window", "16", *extra]
        with open(log, "wb") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **env}, start_new_session=True)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}); see {log}")
            try:
                if requests.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(1)
        self.stop()
        raise RuntimeError(f"server not healthy; see {log}")

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def flush(self) -> None:
        assert requests.post(self.url + "/flush_cache", timeout=60).status_code == 200

    def ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False).input_ids)

    def stream_all(self, prompts: list[list[int]]) -> list[dict]:
        """The prompts sent at once."""
        with ThreadPoolExecutor(4) as pool:
            return list(pool.map(self.stream, prompts))

    def stream(self, input_ids: list[int]) -> dict:
        """Greedy generation, streamed: answer, cached tokens, time to the first token."""
        t0 = time.perf_counter()
        ttft, last = None, None
        with requests.post(self.url + "/generate", stream=True, timeout=600, json={
                "input_ids": input_ids, "stream": True,
                "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}}) as r:
            assert r.status_code == 200, r.text
            for line in r.iter_lines():
                if not line.startswith(b"data:") or line.strip() == b"data: [DONE]":
                    continue
                last = json.loads(line[5:])
                if ttft is None and last.get("output_ids"):
                    ttft = time.perf_counter() - t0
        return {"prompt_tokens": len(input_ids), "cached_tokens": last["meta_info"]["cached_tokens"],
                "ttft_s": ttft, "output_ids": last["output_ids"]}


class NativeEngine:
    """The native engine in process (`--native`: the built-in model, byte tokenizer, 8 slots, 2 cache entries) with
    its prefix cache on a grid of `interval` tokens; an interval longer than any sequence keeps one state per
    prompt (the prompt without its last token)."""

    def __init__(self, interval: int):
        from sglang_replayssm.native.engine import Engine, EngineArgs, SamplingParams

        self.e = Engine(EngineArgs(max_running_requests=8, max_model_len=2048, prefix_cache_entries=2,
                                   prefix_cache_interval=interval))
        self.params = SamplingParams(max_tokens=NEW_TOKENS, ignore_eos=True)
        self.hits: dict[int, int] = {}
        lookup = self.e.cache.lookup

        def logged(prompt):   # the tokens each request found in the cache
            hit = lookup(prompt)
            self.hits[id(prompt)] = hit[1] if hit else 0
            return hit
        self.e.cache.lookup = logged

    def ids(self, text: str) -> list[int]:
        return self.e.tokenizer.encode(text)

    def stream_all(self, prompts: list[list[int]]) -> list[dict]:
        """The prompts admitted together; TTFT in engine steps is not measured (0)."""
        reqs = [self.e.add_request(p, self.params) for p in prompts]
        while self.e.has_work():
            self.e.step()
        return [{"prompt_tokens": len(r.prompt), "cached_tokens": self.hits.get(id(r.prompt), 0), "ttft_s": 0.0,
                 "output_ids": r.output} for r in reqs]

    def stream(self, input_ids: list[int]) -> dict:
        return self.stream_all([input_ids])[0]


def native_main(out: Path) -> None:
    """Grid 64 against one state per prompt; the answers must be the same."""
    results = {}
    for name, interval in (("grid_64", 64), ("one_per_prompt", 1 << 30)):
        rows = workload(NativeEngine(interval))
        results[name] = {"summary": summary(rows), "answers": [r.pop("output_ids") for r in rows], "requests": rows}
        sums = results[name]["summary"]
        print(name, json.dumps({w: (v["cached_tokens"], v["prompt_tokens"]) for w, v in sums.items()}))
    assert results["grid_64"].pop("answers") == results["one_per_prompt"].pop("answers"), "answers differ"
    results["command"] = " ".join(["python", "bench/prefix_cache.py", *sys.argv[1:]])
    out.write_text(json.dumps(results, indent=1))


def workload(srv) -> list[dict]:
    rows = []

    def run(name, x):
        rows.append({"workload": name, **srv.stream(x)})
        return rows[-1]["output_ids"]

    prefix = srv.ids(SYSTEM + EXAMPLES)
    for q in QUESTIONS:
        run("few-shot", prefix + srv.ids(q))
    conv = srv.ids(SYSTEM + "User: tell me about the moon.\nAssistant:")
    conv = conv + run("forks", conv) + srv.ids("\nUser: and the sun?\nAssistant:")
    conv = conv + run("forks", conv)
    branches = [conv + srv.ids(f"\nUser: {q}\nAssistant:") for q in ("why?", "how far?", "how old?", "how big?")]
    rows += [{"workload": "forks", **r} for r in srv.stream_all(branches)]
    turn = srv.ids(SYSTEM + "User: name a prime number.\nAssistant:")
    for follow in ("another one?", "a bigger one?", "the sum of the two?", "is it prime?"):
        turn = turn + run("multi-turn", turn) + srv.ids(f"\nUser: {follow}\nAssistant:")
    return rows


def summary(rows: list[dict]) -> dict:
    out = {}
    for name in dict.fromkeys(r["workload"] for r in rows):
        rs = [r for r in rows if r["workload"] == name]
        later = rs[1:]   # the first request of a workload has nothing to hit
        out[name] = {"requests": len(rs), "prompt_tokens": sum(r["prompt_tokens"] for r in rs),
                     "cached_tokens": sum(r["cached_tokens"] for r in rs),
                     "mean_ttft_s_after_first": sum(r["ttft_s"] for r in later) / max(len(later), 1)}
    tot_p = sum(v["prompt_tokens"] for v in out.values())
    tot_c = sum(v["cached_tokens"] for v in out.values())
    out["all"] = {"prompt_tokens": tot_p, "cached_tokens": tot_c, "prefill_saved": tot_c / tot_p,
                  "mean_ttft_s": sum(r["ttft_s"] for r in rows) / len(rows)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", type=Path, help="tiny checkpoints folder (qwen3_next inside)")
    ap.add_argument("--native", action="store_true", help="the native engine in process instead (NativeEngine)")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    if args.native:
        return native_main(args.out or Path("bench/results/prefix_cache_native_cpu.json"))
    if args.model_dir is None:
        ap.error("--model-dir: required (or --native)")
    args.out = args.out or Path("bench/results/prefix_cache_cpu.json")
    results, answers = {}, {}
    for name, (extra, env) in STRATEGIES.items():
        srv = Server(args.model_dir / "qwen3_next", extra, env, args.out.with_name(f"prefix_cache_{name}.log"))
        try:
            srv.stream(srv.ids("warm up"))
            srv.flush()
            rows = workload(srv)
        finally:
            srv.stop()
        answers[name] = [r.pop("output_ids") for r in rows]
        results[name] = {"argv": extra, "env": env, "summary": summary(rows), "requests": rows}
        print(name, json.dumps(results[name]["summary"]["all"]))
    # greedy answers of the two servers (they may part at a near tie: the cached prefix lengths differ, so do
    # the prefill chunks and their float rounding); the tests hold each to the uncached answer
    results["answers_equal"] = sum(x == y for x, y in zip(answers["no_buffer"], answers["extra_buffer"]))
    results["requests"] = len(answers["no_buffer"])
    a, b = results["extra_buffer"]["summary"], results["no_buffer"]["summary"]
    results["extra_vs_no_buffer"] = {
        w: {"cached_tokens": (a[w]["cached_tokens"], b[w]["cached_tokens"]),
            "ttft_ratio": (a[w].get("mean_ttft_s_after_first") or a[w].get("mean_ttft_s"))
            / (b[w].get("mean_ttft_s_after_first") or b[w].get("mean_ttft_s"))} for w in a}
    results["command"] = " ".join(["python", "bench/prefix_cache.py", *sys.argv[1:]])
    args.out.write_text(json.dumps(results, indent=1))
    print(json.dumps(results["extra_vs_no_buffer"], indent=1))


if __name__ == "__main__":
    main()
