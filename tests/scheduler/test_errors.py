"""Clear errors: unreachable Ray cluster, bad replica count, a cluster too small for the replicas."""

import subprocess
import sys

import pytest

from sglang_replayssm.scheduler.engine_process import free_port
from sglang_replayssm.scheduler.serve_app import SchedulerError, SchedulerOptions, check_capacity


def _launch(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "sglang_replayssm.launch", "--engine", "native", *args],
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("scheme", ["", "ray://"])
def test_unreachable_ray_address_is_a_clear_error(scheme):
    addr = f"{scheme}127.0.0.1:{free_port()}"  # nothing listens there
    r = _launch("--replicas", "2", "--ray-address", addr)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "--ray-address" in r.stderr and "cannot reach the Ray cluster" in r.stderr and addr in r.stderr
    assert "Traceback" not in r.stderr


def test_malformed_ray_address_is_a_clear_error():
    r = _launch("--replicas", "2", "--ray-address", "not-an-address")
    assert r.returncode == 2 and "--ray-address" in r.stderr and "HOST:PORT" in r.stderr


@pytest.mark.parametrize("n", ["0", "-3"])
def test_bad_replica_count_on_the_command_line(n):
    r = _launch("--replicas", n)
    assert r.returncode == 2 and "--replicas" in r.stderr and ">= 1" in r.stderr


def test_more_gpu_replicas_than_the_cluster_has(cluster):
    opts = SchedulerOptions(replicas=3, replica_num_gpus=1, replica_num_cpus=0)
    with pytest.raises(SchedulerError, match=r"--replicas: 3 replicas x 1 GPU .* the Ray cluster has 0"):
        check_capacity(opts)
