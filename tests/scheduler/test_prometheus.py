"""A real Prometheus (Debian package `prometheus`) scrapes the router and the replicas (Ray's metrics
port); every query of the Grafana dashboard is evaluated through Prometheus' HTTP API and must
return data. Runs after test_cluster.py, on the same cluster and its traffic."""

import asyncio
import json
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import yaml

from sglang_replayssm.scheduler.engine_process import free_port

from .client import complete

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "replayssm-serving.json"
PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"


def dashboard_queries():
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", ())]
    assert exprs and all(isinstance(e, str) and e for e in exprs)
    return exprs


def test_deploy_prometheus_config_is_valid_yaml():
    cfg = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    jobs = {j["job_name"] for j in cfg["scrape_configs"]}
    assert {"replayssm-router", "ray"} <= jobs


def test_prometheus_scrapes_and_every_dashboard_query_has_data(cluster, tmp_path):
    assert Path(PROMETHEUS).exists(), "prometheus not installed: apt-get install -y prometheus"
    router = cluster["url"].split("://", 1)[1]
    cfg = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {"job_name": "replayssm-router", "metrics_path": "/metrics", "static_configs": [{"targets": [router]}]},
            {"job_name": "ray", "static_configs": [{"targets": [f"127.0.0.1:{cluster['metrics_port']}"]}]},
        ],
    }
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(cfg))
    port = free_port()
    proc = subprocess.Popen([PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp_path / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    prom = f"http://127.0.0.1:{port}"
    exprs = dashboard_queries()
    try:
        async def main():
            async with httpx.AsyncClient(base_url=cluster["url"], timeout=120) as c, \
                    httpx.AsyncClient(base_url=prom, timeout=10) as p:
                deadline = time.monotonic() + 30
                while True:
                    try:
                        if (await p.get("/-/ready")).status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    assert time.monotonic() < deadline, "prometheus did not become ready"
                    await asyncio.sleep(0.2)
                missing = list(exprs)
                i = 0
                deadline = time.monotonic() + 90
                while missing and time.monotonic() < deadline:
                    # keep traffic flowing so rates and latency quantiles have samples in their window
                    await asyncio.gather(*(complete(c, f"prometheus traffic {i + k} shared prefix here", 4,
                                                    stream=bool(k % 2), ignore_eos=True) for k in range(4)))
                    i += 4
                    still = []
                    for e in missing:
                        r = (await p.get("/api/v1/query", params={"query": e})).json()
                        assert r["status"] == "success", (e, r)
                        if not r["data"]["result"]:
                            still.append(e)
                    missing = still
                targets = (await p.get("/api/v1/targets")).json()["data"]["activeTargets"]
                tput = (await p.get("/api/v1/query", params={
                    "query": "sum(rate(replayssm_router_generated_tokens_total[1m]))"})).json()
                return missing, targets, tput

        missing, targets, tput = asyncio.run(main())
        assert {t["labels"]["job"]: t["health"] for t in targets} == {"replayssm-router": "up", "ray": "up"}
        assert not missing, f"dashboard queries without data: {missing}"
        assert float(tput["data"]["result"][0]["value"][1]) > 0
    finally:
        proc.terminate()
        proc.wait(10)
