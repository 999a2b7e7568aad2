"""Routing policy of the Ray Serve router on a real local Ray cluster of native-engine replicas.

Experiment `batching`: `pack` (fill a replica up to its target batch before using the next) vs
`spread` (least loaded).

For each policy and client concurrency it sends a fixed set of requests through the router and
samples the router's /metrics every 0.1 s (engine-reported running requests per replica = the batch
each engine decodes). Reported per run: throughput, latency (e2e p50/p95), mean decode batch per
busy replica, fraction of samples in which a replica was idle (capacity that could be scaled
down), share of requests per replica.

Experiment `affinity`: multi-turn conversations (each turn's prompt extends the previous turn's
prompt + answer) routed by our router (prefix affinity, target batch = conversations / replicas)
vs no affinity with power-of-two-choices (Ray Serve's stock policy: two random replicas, the less
loaded one, ties at random). Reported: the engines' prompt-prefix cache hits and prompt tokens not prefilled
(`replayssm:prefix_cache_hits`, `replayssm:prefix_cache_hit_tokens`, summed over replicas), how
many conversations stayed on one replica, latency and throughput.

    python bench/scheduler_policy.py [--experiment all|batching|affinity] [--replicas 2]
        [--concurrency 2 4 8 16] [--requests 48] [--max-tokens 16] [--target-batch 8]
        [--conversations 8] [--turns 5] [--affinity-replicas 4] [--out bench/results/scheduler_policy]

Everything binds 127.0.0.1. Writes OUT.json and OUT.png.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import sys
import time

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

from sglang_replayssm.scheduler import loopback  # noqa: E402

loopback.enable()

import httpx  # noqa: E402

RUNNING = re.compile(r'^replayssm_router_replica_running\{replica="([^"]+)"\} (\S+)$', re.M)


async def sample_batches(client: httpx.AsyncClient, stop: asyncio.Event, out: list):
    while not stop.is_set():
        text = (await client.get("/metrics")).text
        out.append({r: float(v) for r, v in RUNNING.findall(text)})
        await asyncio.sleep(0.1)


async def run_level(url: str, concurrency: int, n: int, max_tokens: int, tag: str):
    sem = asyncio.Semaphore(concurrency)
    lat, replicas, errors = [], [], 0
    samples: list = []
    stop = asyncio.Event()
    limits = httpx.Limits(max_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as c:
        sampler = asyncio.create_task(sample_batches(c, stop, samples))

        async def one(i):
            nonlocal errors
            async with sem:
                t0 = time.monotonic()
                r = await c.post("/v1/completions", json={
                    "prompt": f"{tag} request {i}: tell me something new", "max_tokens": max_tokens,
                    "ignore_eos": True, "temperature": 0.0})
                if r.status_code != 200:
                    errors += 1
                    return
                lat.append(time.monotonic() - t0)
                replicas.append(r.json()["replayssm"]["replica"])

        t0 = time.monotonic()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.monotonic() - t0
        stop.set()
        await sampler
    busy = [v for s in samples for v in s.values() if v > 0]
    idle = [v for s in samples for v in s.values() if v == 0]
    share = {r: replicas.count(r) for r in sorted(set(replicas))}
    lat.sort()
    return {
        "concurrency": concurrency, "requests": n, "errors": errors, "seconds": round(wall, 2),
        "tokens_per_s": round(n * max_tokens / wall, 1), "requests_per_s": round(n / wall, 2),
        "e2e_p50_s": round(lat[len(lat) // 2], 3) if lat else None,
        "e2e_p95_s": round(lat[min(len(lat) - 1, int(len(lat) * 0.95))], 3) if lat else None,
        "mean_batch_busy_replica": round(statistics.mean(busy), 2) if busy else 0.0,
        "idle_replica_fraction": round(len(idle) / max(1, len(idle) + len(busy)), 3),
        "requests_per_replica": share, "replicas_used": len(share),
    }


async def engine_totals(client: httpx.AsyncClient, names):
    text = (await client.get("/metrics")).text
    out = {}
    for n in names:
        out[n] = sum(float(v) for v in re.findall(rf'^{re.escape(n)}{{[^}}]*}} (\S+)$', text, re.M))
    return out


async def run_conversations(url: str, conversations: int, turns: int, max_tokens: int, tag: str):
    names = ("replayssm:prefix_cache_hits_total", "replayssm:prefix_cache_hit_tokens_total",
             "sglang:prompt_tokens_total")
    lat, errors, placement = [], 0, {}
    async with httpx.AsyncClient(base_url=url, timeout=600) as c:
        await asyncio.sleep(2.0)  # let the engines' counters reach the router
        before = await engine_totals(c, names)

        async def conversation(k):
            nonlocal errors
            prompt = f"[{tag} conversation {k}] System: you are a terse assistant. User: question {k}?\n"
            for t in range(turns):
                t0 = time.monotonic()
                r = await c.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens,
                                                          "ignore_eos": True, "temperature": 0.0})
                if r.status_code != 200:
                    errors += 1
                    return
                lat.append(time.monotonic() - t0)
                j = r.json()
                placement.setdefault(k, []).append(j["replayssm"]["replica"])
                prompt += j["choices"][0]["text"] + f"\nUser: follow-up {t}?\n"

        t0 = time.monotonic()
        await asyncio.gather(*(conversation(k) for k in range(conversations)))
        wall = time.monotonic() - t0
        # the engines' counters reach the router with the replicas' routing stats: wait until settled
        after, t_end = await engine_totals(c, names), time.monotonic()
        while time.monotonic() - t_end < 15:
            await asyncio.sleep(1.0)
            now = await engine_totals(c, names)
            if now == after and time.monotonic() - t_end > 3:
                break
            after = now
    n = conversations * turns
    lat.sort()
    return {
        "conversations": conversations, "turns": turns, "requests": n, "errors": errors,
        "seconds": round(wall, 2), "tokens_per_s": round(n * max_tokens / wall, 1),
        "e2e_p50_s": round(lat[len(lat) // 2], 3), "e2e_p95_s": round(lat[min(len(lat) - 1, int(len(lat) * 0.95))], 3),
        "prefix_cache_hits": after[names[0]] - before[names[0]],
        "prefix_cache_hit_tokens": after[names[1]] - before[names[1]],
        "prompt_tokens_prefilled": after[names[2]] - before[names[2]],
        "conversations_on_one_replica": sum(1 for v in placement.values() if len(set(v)) == 1),
    }


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--concurrency", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--target-batch", type=int, default=8)
    p.add_argument("--engine-args", default="--device cpu --max-running-requests 8")
    p.add_argument("--experiment", choices=("all", "batching", "affinity"), default="all")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--affinity-replicas", type=int, default=4)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--affinity-engine-args", default="--device cpu --max-running-requests 8 --prefix-cache-entries 4")
    p.add_argument("--out", default="bench/results/scheduler_policy")
    a = p.parse_args(argv)

    import ray
    from ray import serve

    from sglang_replayssm.scheduler.engine_process import free_port
    from sglang_replayssm.scheduler.policy import PolicyConfig
    from sglang_replayssm.scheduler.serve_app import SchedulerOptions, start

    ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, log_to_driver=False,
             runtime_env={"worker_process_setup_hook": loopback.HOOK})
    results = {"command": "python " + " ".join([sys.argv[0]] + (argv if argv is not None else sys.argv[1:])),
               "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
               "replicas": a.replicas, "target_batch": a.target_batch, "max_tokens": a.max_tokens,
               "engine_args": a.engine_args, "runs": {}, "affinity": {}}
    port = free_port()
    try:
        for policy in (("pack", "spread") if a.experiment in ("all", "batching") else ()):
            opts = SchedulerOptions(replicas=a.replicas, port=port, engine_argv=a.engine_args.split(),
                                    replica_num_cpus=0, stats_period_s=0.1,
                                    policy=PolicyConfig(policy=policy, target_batch=a.target_batch))
            url = start(opts, blocking_timeout_s=600)
            asyncio.run(run_level(url, 2, 4, 4, "warmup"))
            results["runs"][policy] = []
            for conc in a.concurrency:
                r = asyncio.run(run_level(url, conc, a.requests, a.max_tokens, f"{policy}-{conc}"))
                print(policy, r, flush=True)
                results["runs"][policy].append(r)
            serve.delete("replayssm")
        per_replica = -(-a.conversations // a.affinity_replicas)  # the conversations fill every replica
        for name, pol in ((("affinity", PolicyConfig(policy="pack", target_batch=per_replica)),
                           ("power_of_two", PolicyConfig(policy="spread", spill="power_of_two",
                                                         min_prefix_chars=10**9)))
                          if a.experiment in ("all", "affinity") else ()):
            opts = SchedulerOptions(replicas=a.affinity_replicas, port=port, engine_argv=a.affinity_engine_args.split(),
                                    replica_num_cpus=0, stats_period_s=0.2, policy=pol)
            url = start(opts, blocking_timeout_s=600)
            asyncio.run(run_level(url, 2, 4, 4, "warmup"))
            r = asyncio.run(run_conversations(url, a.conversations, a.turns, a.max_tokens, name))
            print(name, r, flush=True)
            results["affinity"][name] = r
            serve.delete("replayssm")
        results["affinity_engine_args"] = a.affinity_engine_args
        results["affinity_replicas"] = a.affinity_replicas
    finally:
        serve.shutdown()
        ray.shutdown()
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(results, f, indent=2)
    if results["runs"]:
        plot(results, a.out + ".png")
    print("wrote", a.out + ".json", a.out + ".png")


def plot(results, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    for policy, runs in results["runs"].items():
        x = [r["concurrency"] for r in runs]
        axes[0].plot(x, [r["mean_batch_busy_replica"] for r in runs], "o-", label=policy)
        axes[1].plot(x, [r["idle_replica_fraction"] for r in runs], "o-", label=policy)
        axes[2].plot(x, [r["tokens_per_s"] for r in runs], "o-", label=policy)
    for ax, t in zip(axes, ("mean decode batch per busy replica", "idle replica fraction", "tokens/s (router)")):
        ax.set_title(t)
        ax.set_xlabel("client concurrency")
        ax.set_xscale("log", base=2)
        ax.legend()
    fig.suptitle(f"{results['replicas']} native CPU replicas, target batch {results['target_batch']}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
