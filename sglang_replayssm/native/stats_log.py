"""The native server's console lines: the capacity line at start and the periodic stats line (like
SGLang's decode-batch log), from the engine's info and the stats it sends with every step.

`capacity_line(info)`: slots, SSM-state bytes per sequence here (the pool's own tensors, pool.bytes_per_slot)
next to what a conventional engine holds, its state plus a snapshot per draft token (ReplayStatePool.capacity),
and which needs more; the KV cache, the warm-up.
`stats_line(prev, cur, dt)`: running / waiting requests, slot use, prompt and generation tokens/s
over the last interval, speculative acceptance. `log_stats` prints one every `interval` seconds while
the engine did anything in it (0: never)."""

from __future__ import annotations

import asyncio
import sys


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def capacity_line(info: dict) -> str:
    """Slots, then the SSM state one sequence holds here next to what a conventional engine holds for it (its
    state, plus one state snapshot per draft token when drafts are verified), said plainly: which is which, and
    which needs more memory (ReplaySSM trades memory for bandwidth: its record ring costs memory, the snapshots
    it saves are drafts', so without drafts it holds more)."""
    ours, snap, slots = info["state_bytes_per_sequence"], info["snapshot_state_bytes_per_sequence"], info["slots"]
    drafts = info.get("speculative_num_draft_tokens", 0)
    conventional = (f"a conventional engine holds {_size(snap)} (its state"
                    + (f" + a snapshot per draft token, {drafts} drafts)" if drafts else ", no drafts)"))
    if info["mode"] == "conventional":
        state = f"SSM state per sequence: {_size(ours)} (conventional: the full state, rewritten each token)"
    else:
        scheme = (f"ReplaySSM: checkpoint {info['ckpt_precision']} + ring of {info['window']} records"
                  + (f" + {drafts} drafts" if drafts else "") + f", read copy {info['read_copy']}")
        ratio = ours / snap
        verdict = (f"ReplaySSM needs {ratio:.2f}x the memory" if ratio >= 1
                   else f"ReplaySSM needs {1 - ratio:.0%} less memory")
        state = f"SSM state per sequence: {_size(ours)} here ({scheme}), {conventional}: {verdict}"
    return (f"sglang-replayssm capacity: {slots} slots; {state}; KV cache {_size(info['kv_cache_bytes'])}; "
            f"{info['prefix_cache_entries']} prefix-cache entries; warm-up {info.get('warmup_s', 0.0):.2f} s")


def stats_line(prev: dict, cur: dict, dt: float) -> str:
    gen = cur.get("generation_tokens", 0) - prev.get("generation_tokens", 0)
    prompt = cur.get("prompt_tokens", 0) - prev.get("prompt_tokens", 0)
    drafts = cur.get("draft_tokens", 0) - prev.get("draft_tokens", 0)
    accepted = cur.get("accepted_draft_tokens", 0) - prev.get("accepted_draft_tokens", 0)
    total = cur.get("total_slots", 0)
    used = total - cur.get("free_slots", total)
    line = (f"sglang-replayssm stats: #running-req: {cur.get('running', 0)}, #queue-req: {cur.get('waiting', 0)}, "
            f"slots used: {used}/{total}, prompt throughput (token/s): {prompt / dt:.1f}, "
            f"gen throughput (token/s): {gen / dt:.1f}")
    if drafts:
        line += f", draft acceptance: {accepted / drafts:.2f}"
    return line


def active(prev: dict, cur: dict) -> bool:
    return bool(cur.get("running") or cur.get("waiting")
                or cur.get("generation_tokens", 0) != prev.get("generation_tokens", 0))


async def log_stats(get_stats, interval: float) -> None:
    """Print a stats line every `interval` seconds in which the engine had work (runs until cancelled)."""
    loop = asyncio.get_running_loop()
    prev, t = dict(get_stats()), loop.time()
    while True:
        await asyncio.sleep(interval)
        cur, now = dict(get_stats()), loop.time()
        if active(prev, cur):
            print(stats_line(prev, cur, max(now - t, 1e-9)), file=sys.stderr, flush=True)
        prev, t = cur, now
