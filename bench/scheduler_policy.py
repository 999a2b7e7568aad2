"""Batching policy of the Ray Serve router: `pack` (fill a replica up to its target batch before using
the next) vs `spread` (least loaded), on a real local Ray cluster of native-engine replicas.

For each policy and client concurrency it sends a fixed set of requests through the router and
samples the router's /metrics every 0.1 s (engine-reported running requests per replica = the batch
each engine decodes). Reported per run: throughput, latency (e2e p50/p95), mean decode batch per
busy replica, fraction of samples in which a replica was idle (capacity that could be scaled
down), share of requests per replica.

    python bench/scheduler_policy.py [--replicas 2] [--concurrency 2 4 8 16] [--requests 48]
        [--max-tokens 16] [--target-batch 8] [--out bench/results/scheduler_policy]

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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--concurrency", type=int, nargs="+", default=[2, 4, 8, 16])
    p.add_argument("--requests", type=int, default=48)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--target-batch", type=int, default=8)
    p.add_argument("--engine-args", default="--device cpu --max-running-requests 8")
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
               "engine_args": a.engine_args, "runs": {}}
    port = free_port()
    try:
        for policy in ("pack", "spread"):
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
    finally:
        serve.shutdown()
        ray.shutdown()
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out + ".json", "w") as f:
        json.dump(results, f, indent=2)
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
