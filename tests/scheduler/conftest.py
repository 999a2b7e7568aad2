"""One real local Ray cluster + Serve application for the scheduler tests (this package).

Everything binds 127.0.0.1 (Ray node address forced to loopback, see scheduler/loopback.py), ports
are picked at run time, usage stats and the dashboard are off, replicas reserve no CPU (2-core CI).
At teardown Serve and Ray are shut down and every Ray process this session started is checked gone.
"""

import os
import time
import uuid

import pytest

os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
os.environ.setdefault("RAY_SERVE_LOG_TO_STDERR", "0")

from sglang_replayssm.scheduler import loopback  # noqa: E402

loopback.enable()  # before ray is imported anywhere in this process

from sglang_replayssm.scheduler.engine_process import free_port  # noqa: E402
from sglang_replayssm.scheduler.policy import PolicyConfig  # noqa: E402

from .client import HealthProbe, pids_with_env  # noqa: E402
from .engine_setup import engine_argv  # noqa: E402

NUM_REPLICAS = 2
# small numbers so a handful of test requests exercise packing, affinity and the override
POLICY = PolicyConfig(policy="pack", target_batch=2, imbalance_threshold=2, min_prefix_chars=16, block_chars=8)


# Every process the cluster fixture starts (Ray's, the replicas', the engines') inherits this marker
# (set only while ray.init spawns the GCS and raylet, whose children inherit their environment), so
# they can be found - and only they - even after a guard or engine was re-parented.
MARKER = "SGLANG_REPLAYSSM_TEST_SESSION"
SESSION = uuid.uuid4().hex


def session_pids():
    """PIDs of live processes carrying this session's marker (this pytest process excluded)."""
    return pids_with_env(f"{MARKER}={SESSION}")


@pytest.fixture(scope="package")   # torn down before tests/sglang_server starts its own Ray cluster
def cluster(tmp_path_factory):
    import ray
    from ray import serve

    from sglang_replayssm.scheduler.serve_app import SchedulerOptions, start

    tmp = tmp_path_factory.mktemp("scheduler")
    metrics_port = free_port()
    os.environ[MARKER] = SESSION
    try:
        ray.init(address="local", _node_ip_address="127.0.0.1", include_dashboard=False, num_cpus=2,
                 _metrics_export_port=metrics_port, log_to_driver=False,
                 runtime_env={"worker_process_setup_hook": loopback.HOOK},
                 _system_config={"metrics_report_interval_ms": 1000})
    finally:
        del os.environ[MARKER]  # this process's other children (other tests' servers) stay unmarked
    port = free_port()
    opts = SchedulerOptions(replicas=NUM_REPLICAS, port=port, engine="native", engine_argv=engine_argv(tmp),
                            replica_num_cpus=0, health_check_period_s=1.0, stats_period_s=0.5,
                            log_dir=str(tmp / "logs"), policy=POLICY)
    t0 = time.monotonic()
    probe = HealthProbe(f"http://127.0.0.1:{port}")   # the router's /health from its first moment
    url = start(opts, blocking_timeout_s=300)
    probe.done.wait(120)
    info = {"url": url, "metrics_port": metrics_port, "opts": opts, "tmp": tmp,
            "startup_s": time.monotonic() - t0, "health_probe": probe.result}
    try:
        yield info
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
        deadline = time.monotonic() + 30
        while session_pids() and time.monotonic() < deadline:
            time.sleep(0.5)
        left = session_pids()
        for pid in left:  # a failure must not leak processes into the rest of the suite (ours only)
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        assert not left, f"Ray/engine processes left after shutdown: {left}"
