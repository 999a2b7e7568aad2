"""The deploy files parse and point at real code: the `ray up` YAML validates against Ray's own
cluster-config schema; the KubeRay RayService's serveConfigV2 builds our Serve application. Neither
leaves the Ray dashboard open: `ray up` binds it to the head's 127.0.0.1; on KubeRay (whose operator
must reach it) a NetworkPolicy admits only the operator to it; the router asks for an API key."""

import json
from pathlib import Path

import jsonschema
import pytest
import ray
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_ray_cluster_yaml_matches_rays_schema():
    cfg = yaml.safe_load((DEPLOY / "ray-cluster.yaml").read_text())
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(cfg, schema)
    assert any("--metrics-export-port=8080" in c for c in cfg["head_start_ray_commands"])
    (head,) = [c for c in cfg["head_start_ray_commands"] if "ray start --head" in c]
    assert "--dashboard-host=127.0.0.1" in head.split()
    assert "0.0.0.0" not in " ".join(cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"])
    text = (DEPLOY / "ray-cluster.yaml").read_text()
    assert "--host 0.0.0.0" in text and "--api-key" in text   # the documented router command has a key


def _kuberay():
    docs = list(yaml.safe_load_all((DEPLOY / "kuberay-rayservice.yaml").read_text()))
    return {d["kind"]: d for d in docs}


def test_rayservice_serve_config_builds_the_app(monkeypatch):
    from ray.serve.schema import ServeDeploySchema

    from sglang_replayssm.scheduler.serve_app import ENGINE_DEPLOYMENT, ROUTER_DEPLOYMENT, SchedulerError, app_builder

    svc = _kuberay()["RayService"]
    assert svc["apiVersion"] == "ray.io/v1" and svc["kind"] == "RayService"
    serve_cfg = yaml.safe_load(svc["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(serve_cfg)
    (app,) = serve_cfg["applications"]
    assert app["import_path"] == "sglang_replayssm.scheduler.serve_app:app_builder"
    env = app["args"]["api_key_env"]
    monkeypatch.delenv(env, raising=False)
    with pytest.raises(SchedulerError, match=f"api_key_env: the environment variable '{env}' is not set"):
        app_builder(app["args"])
    monkeypatch.setenv(env, "k8s-secret-key")
    built = app_builder(app["args"])
    router = built._bound_deployment
    assert router._name == ROUTER_DEPLOYMENT
    engine = router._replica_config.init_args[0]._bound_deployment
    assert engine._name == ENGINE_DEPLOYMENT
    assert engine._deployment_config.num_replicas == app["args"]["replicas"]
    assert engine._replica_config.ray_actor_options["num_gpus"] == 1
    assert engine._replica_config.init_args[:2] == ("sglang", app["args"]["engine_argv"] + ["--api-key", "k8s-secret-key"])
    assert router._replica_config.init_args[3] == "k8s-secret-key"
    # every Ray container gets the key from the Secret the header comment creates
    cluster = svc["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]] + [g["template"] for g in cluster["workerGroupSpecs"]]
    for pod in pods:
        (c,) = pod["spec"]["containers"]
        (var,) = [e for e in c["env"] if e["name"] == env]
        assert var["valueFrom"]["secretKeyRef"] == {"name": "sglang-replayssm-api-key", "key": "api-key"}


def test_rayservice_dashboard_is_reachable_only_by_the_operator():
    docs = _kuberay()
    head = docs["RayService"]["spec"]["rayClusterConfig"]["headGroupSpec"]
    pol = docs["NetworkPolicy"]["spec"]
    assert pol["policyTypes"] == ["Ingress"]
    head_labels = head["template"]["metadata"]["labels"]
    assert pol["podSelector"]["matchLabels"].items() <= head_labels.items()
    dashboard_rules = [r for r in pol["ingress"] if any(p["port"] == 8265 for p in r.get("ports", []))]
    assert dashboard_rules == [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
        "app.kubernetes.io/name": "kuberay-operator"}}}], "ports": [{"protocol": "TCP", "port": 8265}]}]
    for rule in pol["ingress"]:
        if "from" not in rule:      # open to the whole cluster: only the router and the metrics
            assert {p["port"] for p in rule["ports"]} == {8000, 8080}
        elif rule not in dashboard_rules:   # all ports, but only from this Ray cluster's own pods
            (peer,) = rule["from"]
            assert peer == {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "sglang-replayssm"}}}
            for g in docs["RayService"]["spec"]["rayClusterConfig"]["workerGroupSpecs"]:
                assert g["template"]["metadata"]["labels"]["app.kubernetes.io/name"] == "sglang-replayssm"


def test_rayservice_head_takes_the_router_and_no_engine_replica(monkeypatch):
    """As docs/scheduler.md's multi-node section has it: the router deployment asks for the head node's
    resource (it runs beside Serve's proxy, and a lost worker node loses engine replicas only), and the
    engine replicas need a GPU, which the KubeRay head does not offer (rayStartParams num-gpus "0") while
    every worker group does."""
    from sglang_replayssm.scheduler.serve_app import HEAD_NODE_RESOURCE, app_builder

    svc = _kuberay()["RayService"]
    (app,) = yaml.safe_load(svc["spec"]["serveConfigV2"])["applications"]
    monkeypatch.setenv(app["args"]["api_key_env"], "k8s-secret-key")
    router = app_builder(app["args"])._bound_deployment
    engine = router._replica_config.init_args[0]._bound_deployment
    assert router._replica_config.ray_actor_options["resources"] == {HEAD_NODE_RESOURCE: 0.001}
    assert engine._replica_config.ray_actor_options["num_gpus"] >= 1
    assert "resources" not in engine._replica_config.ray_actor_options   # placed by Serve's SPREAD, anywhere
    cluster = svc["spec"]["rayClusterConfig"]
    assert cluster["headGroupSpec"]["rayStartParams"]["num-gpus"] == "0"
    for g in cluster["workerGroupSpecs"]:
        (c,) = g["template"]["spec"]["containers"]
        assert int(c["resources"]["limits"]["nvidia.com/gpu"]) >= 1 and g["rayStartParams"].get("num-gpus") != "0"


DOCS = DEPLOY.parent / "docs" / "scheduler.md"


def test_the_docs_count_the_dashboards_queries_and_panels_as_they_are():
    """docs/scheduler.md says how many queries and panels deploy/grafana's dashboard has (issue 48: it said 43 in
    20 while the dashboard had grown); test_prometheus.py evaluates every one of those queries."""
    import re

    panels = json.loads((DEPLOY / "grafana" / "replayssm-serving.json").read_text())["panels"]
    nested = [q for p in panels for q in p.get("panels", ())]
    assert not nested   # a row's nested panels would need counting too
    queries = [t["expr"] for p in panels for t in p.get("targets", ())]
    text = " ".join(DOCS.read_text().split())
    m = re.search(r"Every one of its (\d+) queries \((\d+) panels\) is evaluated against a real Prometheus", text)
    assert m, "docs/scheduler.md no longer counts the dashboard's queries"
    assert (int(m.group(1)), int(m.group(2))) == (len(queries), len(panels)), (m.groups(), len(queries), len(panels))


def test_prometheus_scrapes_the_router_where_every_example_puts_it():
    """deploy/prometheus.yml's router target is the --port of every Ray example in docs/scheduler.md and README.md
    (issue 48: it scraped 30000, the single server's default, while every example said --port 8000)."""
    import re

    from tests.user_path.readme import README, join_lines

    cfg = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    (job,) = [j for j in cfg["scrape_configs"] if j["job_name"] == "replayssm-router"]
    (target,) = [t for s in job["static_configs"] for t in s["targets"]]
    ports = []
    for path in (DOCS, README):
        for block in re.findall(r"```bash\n(.*?)```", path.read_text(), flags=re.S):
            for line in join_lines(block):
                if "sglang_replayssm.launch" in line and "--replicas" in line:
                    ports += re.findall(r"--port[ =](\d+)", line)
    assert len(ports) >= 4 and set(ports) == {target.rsplit(":", 1)[1]}, (target, ports)
