"""Prometheus metrics of the native server.

Engine-side totals (counters, gauges) arrive with every engine stats message and are exported by a
collector; request latencies (TTFT, inter-token, end-to-end) are histograms observed in the front
end. Generic names follow SGLang's (`sglang:*`) so one dashboard fits both engines; the `replayssm:*`
metrics (names, help, meaning) are the table of `sglang_replayssm.accounting`.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from sglang_replayssm.accounting import METRICS, NATIVE

# engine stats key of a replayssm: metric: its name after the colon, but for these
_STATS_KEYS = {"replayssm:pool_slots_total": "total_slots", "replayssm:pool_slots_free": "free_slots"}


def _ours(kind: str) -> list[tuple[str, str, str]]:
    return [(m.name, _STATS_KEYS.get(m.name, m.name.split(":", 1)[1]), m.help) for m in METRICS
            if m.kind == kind and NATIVE in m.engines]


# (metric name, stats key, help); counters get "_total" appended in the exposition
COUNTERS = [
    ("sglang:prompt_tokens", "prompt_tokens", "Prefilled prompt tokens"),
    ("sglang:generation_tokens", "generation_tokens", "Generated tokens"),
    ("sglang:num_requests", "requests_finished", "Finished requests"),
    *_ours("counter"),
]
GAUGES = [
    ("sglang:num_running_reqs", "running", "Requests holding a pool slot"),
    ("sglang:num_queue_reqs", "waiting", "Requests waiting for a pool slot"),
    ("sglang:gen_throughput", "gen_throughput", "Generated tokens per second (recent)"),
    ("sglang:token_usage", "pool_usage", "Fraction of pool slots in use"),
    *_ours("gauge"),
]
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


class _EngineStats:
    def __init__(self, source, model_name: str):
        self.source, self.model_name = source, model_name

    def collect(self):
        stats = self.source() or {}
        for name, key, doc in COUNTERS:
            c = CounterMetricFamily(name, doc, labels=["model_name"])
            c.add_metric([self.model_name], float(stats.get(key, 0)))
            yield c
        for name, key, doc in GAUGES:
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric([self.model_name], float(stats.get(key, 0)))
            yield g


class ServerMetrics:
    def __init__(self, stats_source, model_name: str):
        self.registry = CollectorRegistry()
        self.registry.register(_EngineStats(stats_source, model_name))
        kw = dict(labelnames=["model_name"], registry=self.registry, buckets=LATENCY_BUCKETS)
        self.ttft = Histogram("sglang:time_to_first_token_seconds", "Time to first token", **kw).labels(model_name)
        self.itl = Histogram("sglang:inter_token_latency_seconds", "Time between output tokens", **kw).labels(model_name)
        self.e2e = Histogram("sglang:e2e_request_latency_seconds", "Request latency", **kw).labels(model_name)
