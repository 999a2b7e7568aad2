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


def _silent_listener(host):
    """A TCP port that accepts connections and never answers (not a Ray GCS)."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind((host, 0))
    srv.listen(16)
    conns = []

    def accept():
        while True:
            try:
                conns.append(srv.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return srv, conns


def test_a_ray_address_that_answers_but_never_joins_fails_within_the_connect_timeout():
    """A reachable port that is no Ray cluster (or a GCS that never lets this machine join): Ray would retry
    for minutes; the launcher gives up after --ray-connect-timeout with one clear line (issue 33, item 4)."""
    import time

    srv, conns = _silent_listener("127.0.0.1")
    addr = f"127.0.0.1:{srv.getsockname()[1]}"
    try:
        t0 = time.monotonic()
        r = _launch("--replicas", "1", "--ray-address", addr, "--ray-connect-timeout", "4")
        took = time.monotonic() - t0
    finally:
        srv.close()
        for c in conns:
            c.close()
    assert r.returncode == 2, (r.stdout, r.stderr[-2000:])
    err = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(err) == 1 and "--ray-address" in err[0] and addr in err[0] and "within 4 s" in err[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    assert took < 4 + 20, took   # the deadline, plus the interpreter's and ray's import


def test_the_default_connect_timeout_is_30_s_and_a_bad_one_is_refused():
    from sglang_replayssm.scheduler.serve_app import add_scheduler_args

    import argparse

    p = argparse.ArgumentParser()
    add_scheduler_args(p)
    assert p.parse_args([]).ray_connect_timeout == 30.0
    r = _launch("--replicas", "1", "--ray-address", "127.0.0.1:1", "--ray-connect-timeout", "0")
    assert r.returncode == 2 and "--ray-connect-timeout" in r.stderr and "> 0" in r.stderr


def test_only_a_loopback_only_gcs_makes_the_driver_announce_127_0_0_1():
    """127.0.0.1:PORT of a GCS that also answers on the machine's interface address (a cluster of
    `ray start` nodes with the machine's IP) keeps Ray's own address resolution; a GCS on loopback only
    (nodes on 127.0.0.1) makes the driver announce 127.0.0.1 (loopback_join_ip). 127.0.0.2 stands in for
    the interface address, so nothing listens beyond loopback."""
    from sglang_replayssm.scheduler.ray_join import loopback_join_ip

    on_iface, c1 = _silent_listener("127.0.0.2")
    local, c2 = _silent_listener("127.0.0.1")
    try:
        assert loopback_join_ip("127.0.0.1", on_iface.getsockname()[1], iface="127.0.0.2") is None
        assert loopback_join_ip("localhost", local.getsockname()[1], iface="127.0.0.2") == "127.0.0.1"
        assert loopback_join_ip("10.1.2.3", local.getsockname()[1], iface="127.0.0.2") is None  # not loopback
    finally:
        for s in (on_iface, local):
            s.close()
        for c in c1 + c2:
            c.close()


@pytest.mark.parametrize("argv, flag", [
    (["--autoscale", "0:2"], "--autoscale"), (["--autoscale", "3:2"], "--autoscale"),
    (["--autoscale", "2"], "--autoscale"), (["--autoscale", "1:x"], "--autoscale"),
    (["--autoscale", "1:2", "--autoscale-target", "0"], "--autoscale-target"),
    (["--autoscale", "1:2", "--autoscale-delays", "5"], "--autoscale-delays"),
])
def test_bad_autoscale_flags_are_clear_errors(argv, flag):
    r = _launch("--replicas", "1", *argv)
    assert r.returncode == 2 and f"error: {flag}:" in r.stderr and "Traceback" not in r.stderr, r.stderr[-1000:]


def test_replicas_outside_the_autoscale_range_is_a_clear_error():
    r = _launch("--replicas", "3", "--autoscale", "1:2")
    assert r.returncode == 2 and "error: --replicas:" in r.stderr and "1:2" in r.stderr


def test_autoscale_becomes_serves_autoscaling_config():
    """--autoscale MIN:MAX starting at --replicas, the target from the engine's slots unless given, the
    delays; a scaled-down replica gets 30 s to finish its streams. Without it: a fixed num_replicas."""
    import argparse

    from sglang_replayssm.scheduler.serve_app import build_app, options_from_args

    def engine_deployment(argv):
        ns = argparse.Namespace(replicas=2, ray_address=None, host="127.0.0.1", port=8000, engine="native",
                                engine_argv=argv)
        return build_app(options_from_args(ns))._bound_deployment._replica_config.init_args[0]._bound_deployment

    dep = engine_deployment(["--autoscale", "1:4", "--max-running-requests", "16", "--autoscale-delays", "2:30"])
    cfg = dep._deployment_config.autoscaling_config
    assert (cfg.min_replicas, cfg.max_replicas, cfg.initial_replicas, cfg.target_ongoing_requests) == (1, 4, 2, 16)
    assert (cfg.upscale_delay_s, cfg.downscale_delay_s) == (2.0, 30.0)
    assert dep._deployment_config.graceful_shutdown_timeout_s == 30
    assert engine_deployment(["--autoscale", "2:3", "--autoscale-target", "5"])._deployment_config \
        .autoscaling_config.target_ongoing_requests == 5
    fixed = engine_deployment([])
    assert fixed._deployment_config.autoscaling_config is None and fixed._deployment_config.num_replicas == 2
