"""The deploy files parse and point at real code: the `ray up` YAML validates against Ray's own
cluster-config schema; the KubeRay RayService's serveConfigV2 builds our Serve application."""

import json
from pathlib import Path

import jsonschema
import ray
import yaml

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def test_ray_cluster_yaml_matches_rays_schema():
    cfg = yaml.safe_load((DEPLOY / "ray-cluster.yaml").read_text())
    schema = json.loads((Path(ray.__file__).parent / "autoscaler" / "ray-schema.json").read_text())
    jsonschema.validate(cfg, schema)
    assert any("--metrics-export-port=8080" in c for c in cfg["head_start_ray_commands"])


def test_rayservice_serve_config_builds_the_app():
    from ray.serve.schema import ServeDeploySchema

    from sglang_replayssm.scheduler.serve_app import ENGINE_DEPLOYMENT, ROUTER_DEPLOYMENT, app_builder

    svc = yaml.safe_load((DEPLOY / "kuberay-rayservice.yaml").read_text())
    assert svc["apiVersion"] == "ray.io/v1" and svc["kind"] == "RayService"
    serve_cfg = yaml.safe_load(svc["spec"]["serveConfigV2"])
    ServeDeploySchema.model_validate(serve_cfg)
    (app,) = serve_cfg["applications"]
    assert app["import_path"] == "sglang_replayssm.scheduler.serve_app:app_builder"
    built = app_builder(app["args"])
    router = built._bound_deployment
    assert router._name == ROUTER_DEPLOYMENT
    engine = router._replica_config.init_args[0]._bound_deployment
    assert engine._name == ENGINE_DEPLOYMENT
    assert engine._deployment_config.num_replicas == app["args"]["replicas"]
    assert engine._replica_config.ray_actor_options["num_gpus"] == 1
    assert engine._replica_config.init_args[:2] == ("sglang", app["args"]["engine_argv"])
