"""Multi-turn chat against an SGLang server (ours, stock, SGLang's ReplaySSM): conversations that resend their history.

Every conversation opens with the same system prompt, then takes ``--turns`` turns; each turn sends the whole
conversation so far (system prompt, earlier questions and the server's answers) plus a new question, and waits for
its answer before the next turn. ``--concurrency`` conversations run at once, ``--conversations`` in all. This is the
traffic where a radix cache pays: from turn 2 on, a server that kept the conversation's state serves the history from
its cache (SGLang's ``cached_tokens``). Requests go to SGLang's native ``/generate`` (streamed, greedy, ``ignore_eos``:
every answer is ``--max-tokens`` long), which reports the prompt's cached tokens on every server.

    python bench/multi_turn.py --url http://127.0.0.1:30000 --conversations 64 --turns 8 --concurrency 64 \\
        --out multi_turn.json

The JSON holds every turn (prompt, cached and output tokens, time to first token, latency) and a summary: output
tokens per second over the run, TTFT median / p99, the cached share of prompt tokens (all turns, and per turn index).
Prompts are text (a seeded word list), so the token counts are the server's own.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

import aiohttp

WORDS = ("state", "token", "window", "record", "flush", "layer", "model", "cache", "prefix", "decode", "verify",
         "draft", "server", "request", "stream", "batch", "memory", "kernel", "answer", "question", "history",
         "turn", "prompt", "system", "user", "value", "key", "gate", "decay", "update")


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def percentile(values: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


async def one_turn(client: aiohttp.ClientSession, prompt: str, max_tokens: int) -> dict:
    """One streamed, greedy ``/generate``: its answer text (SGLang streams the whole text so far in each chunk),
    token counts and timings."""
    body = {"text": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, "ignore_eos": True}}
    t0 = time.perf_counter()
    ttft, last = None, None
    async with client.post("/generate", json=body) as r:
        if r.status != 200:
            raise RuntimeError(f"/generate answered {r.status}: {(await r.read())[:300]!r}")
        async for raw in r.content:
            line = raw.decode().strip()
            if not line.startswith("data:") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if ttft is None and chunk.get("text"):
                ttft = time.perf_counter() - t0
            last = chunk
    if last is None:
        raise RuntimeError("/generate streamed no answer")
    meta = last["meta_info"]
    return {"text": last["text"], "prompt_tokens": meta["prompt_tokens"], "cached_tokens": meta.get("cached_tokens", 0),
            "output_tokens": meta["completion_tokens"], "ttft_s": ttft if ttft is not None else time.perf_counter() - t0,
            "latency_s": time.perf_counter() - t0}


async def conversation(client, conv: int, system: str, args, rng: random.Random, out: list) -> None:
    history = system
    for turn in range(args.turns):
        history += f"\nUser: {words(rng, args.question_words)}\nAssistant:"
        got = await one_turn(client, history, args.max_tokens)
        history += got.pop("text")
        out.append({"conversation": conv, "turn": turn, **got})


async def run(args) -> dict:
    rng = random.Random(args.seed)
    system = "System: " + words(rng, args.system_words)
    seeds = [rng.randrange(1 << 30) for _ in range(args.conversations)]
    turns: list[dict] = []
    gate = asyncio.Semaphore(args.concurrency)
    done = 0

    async def one(conv: int):
        nonlocal done
        async with gate:
            await conversation(client, conv, system, args, random.Random(seeds[conv]), turns)
        done += 1
        if args.progress:
            print(f"multi_turn: {done}/{args.conversations} conversations", file=sys.stderr, flush=True)

    connector = aiohttp.TCPConnector(limit=args.concurrency + 4)
    timeout = aiohttp.ClientTimeout(total=args.timeout)
    async with aiohttp.ClientSession(base_url=args.url, timeout=timeout, connector=connector) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(one(c) for c in range(args.conversations)))
        duration = time.perf_counter() - t0
    return {"meta": {"url": args.url, "conversations": args.conversations, "turns": args.turns,
                     "concurrency": args.concurrency, "system_words": args.system_words,
                     "question_words": args.question_words, "max_tokens": args.max_tokens, "seed": args.seed,
                     "command": " ".join(sys.argv)},
            "summary": summarize(turns, duration), "turns": sorted(turns, key=lambda t: (t["conversation"], t["turn"]))}


def summarize(turns: list[dict], duration: float) -> dict:
    prompt = sum(t["prompt_tokens"] for t in turns)
    by_turn = {}
    for t in turns:
        p, c = by_turn.get(t["turn"], (0, 0))
        by_turn[t["turn"]] = (p + t["prompt_tokens"], c + t["cached_tokens"])
    ttft = [t["ttft_s"] for t in turns]
    return {"duration_s": duration, "requests": len(turns), "output_tokens": sum(t["output_tokens"] for t in turns),
            "output_tok_s": sum(t["output_tokens"] for t in turns) / duration if duration > 0 else 0.0,
            "ttft_median_s": statistics.median(ttft) if ttft else 0.0, "ttft_p99_s": percentile(ttft, 0.99),
            "prompt_tokens": prompt, "cached_tokens": sum(t["cached_tokens"] for t in turns),
            "cached_share": sum(t["cached_tokens"] for t in turns) / prompt if prompt else 0.0,
            "cached_share_by_turn": {k: (c / p if p else 0.0) for k, (p, c) in sorted(by_turn.items())}}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:30000")
    p.add_argument("--conversations", type=int, default=64)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=64, help="conversations at once")
    p.add_argument("--system-words", type=int, default=400, help="words of the system prompt every conversation shares")
    p.add_argument("--question-words", type=int, default=48, help="words of each new question")
    p.add_argument("--max-tokens", type=int, default=128, help="tokens of each answer (greedy, ignore_eos)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one request may take")
    p.add_argument("--progress", action="store_true", help="a line on stderr per finished conversation")
    p.add_argument("--out", type=Path, help="write the JSON here (else print the summary)")
    args = p.parse_args(argv)
    for name in ("conversations", "turns", "concurrency", "question_words", "max_tokens"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.system_words < 0:
        p.error("--system-words must be at least 0")
    return args


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    result = asyncio.run(run(args))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result["summary"], indent=1))
    return result


if __name__ == "__main__":
    main()
