"""Router-side Prometheus metrics (served at the ingress' GET /metrics).

Measured by the ingress for every request: throughput (generated tokens), TTFT, inter-token
latency, end-to-end latency, routing decisions (prefix hit / load override / pack / spill),
retries. Re-exported from the replicas' routing stats (state.STATE): per-replica load
(running, waiting, free slots, total slots, batch size, cached prefixes, router in-flight), replica
health (stats fresh), and every `replayssm:` sample of each replica's engine with a `replica` label.
Replica-process metrics (Ray's `ray_serve_*` and ours, `ray_replayssm_replica_*`) are exported by
Ray on its metrics port; see docs/scheduler.md.
"""

from __future__ import annotations

import time

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from .policy import DECISIONS
from .state import STATS_TTL_S, RouterState

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
ITL_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
RETRY_KINDS = ("restart", "stream_resume")
LOAD_FIELDS = ("running", "waiting", "free_slots", "total_slots", "batch_size")


class _ReplicaCollector:
    """Per-replica gauges and the engines' replayssm samples, read from RouterState at scrape."""

    def __init__(self, state: RouterState):
        self.state = state

    def collect(self):
        st = self.state
        with st.lock:
            stats = dict(st.stats)
            stamps = dict(st.stats_time)
            inflight = dict(st.inflight)
            loads = dict(st.policy_loads)
            replicas = list(st.seen_replicas)
            tree_nodes = len(st.tree)
        now = time.monotonic()
        fams = {f: GaugeMetricFamily(f"replayssm_router_replica_{f}",
                                     f"engine-reported {f} of each replica", labels=["replica"])
                for f in LOAD_FIELDS + ("cached_prefixes",)}
        up = GaugeMetricFamily("replayssm_router_replica_up",
                               "1 when the replica reported routing stats recently", labels=["replica"])
        inf = GaugeMetricFamily("replayssm_router_replica_inflight",
                                "requests this router has in flight on each replica", labels=["replica"])
        load = GaugeMetricFamily("replayssm_router_replica_load",
                                 "requests the routing policy counted on each replica at its last decision (in "
                                 "flight there, or placed there and not yet handed over by Serve)",
                                 labels=["replica"])
        engine: dict = {}
        for r in replicas:
            s = stats.get(r) or {}
            fresh = r in stamps and now - stamps[r] < STATS_TTL_S
            up.add_metric([r], 1.0 if fresh else 0.0)
            inf.add_metric([r], float(inflight.get(r, 0)))
            if r in loads:
                load.add_metric([r], float(loads[r]))
            for f in LOAD_FIELDS:
                v = s.get(f)
                if isinstance(v, (int, float)):
                    fams[f].add_metric([r], float(v))
            cp = s.get("cached_prefixes")
            if isinstance(cp, (int, float)):
                fams["cached_prefixes"].add_metric([r], float(cp))
            elif isinstance(cp, list):
                fams["cached_prefixes"].add_metric([r], float(len(cp)))
            for row in s.get("engine_metrics") or ():
                try:
                    name, labels, value, typ, fam_name = row
                except (TypeError, ValueError):
                    continue
                key = (fam_name, typ)
                if key not in engine:
                    engine[key] = Metric(fam_name, f"engine metric {fam_name}, per replica",
                                         typ if typ in ("counter", "gauge", "histogram", "summary") else "untyped")
                engine[key].add_sample(name, dict(labels, replica=r), value)
        yield from fams.values()
        yield up
        yield inf
        yield load
        yield GaugeMetricFamily("replayssm_router_prefix_tree_nodes",
                                "nodes in the router's prefix tree", value=float(tree_nodes))
        yield from engine.values()


class RouterMetrics:
    def __init__(self, state: RouterState):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("replayssm_router_requests", "requests answered by the router",
                                ["endpoint", "outcome"], registry=r)
        self.tokens = Counter("replayssm_router_generated_tokens",
                              "completion tokens delivered to clients", registry=r)
        self.ttft = Histogram("replayssm_router_ttft_seconds", "time to first token",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.itl = Histogram("replayssm_router_itl_seconds", "inter-token latency",
                             buckets=ITL_BUCKETS, registry=r)
        self.e2e = Histogram("replayssm_router_e2e_seconds", "request latency, arrival to last token",
                             buckets=LATENCY_BUCKETS, registry=r)
        self.decisions = Counter("replayssm_router_decisions", "routing decisions",
                                 ["decision"], registry=r)
        self.retries = Counter("replayssm_router_retries", "requests re-sent to another replica after a failure",
                               ["kind"], registry=r)
        self.inflight = Gauge("replayssm_router_inflight", "requests in flight at the router", registry=r)
        for d in DECISIONS:
            self.decisions.labels(decision=d)
        for k in RETRY_KINDS:
            self.retries.labels(kind=k)
        for ep in ("completions", "chat"):
            for oc in ("ok", "error", "client_error"):
                self.requests.labels(endpoint=ep, outcome=oc)
        r.register(_ReplicaCollector(state))

    def render(self) -> bytes:
        return generate_latest(self.registry)
