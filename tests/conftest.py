import os
import pathlib

import pytest

# Triton kernels run under the interpreter on CPU machines (CI has no GPU). Must be set before triton
# is imported anywhere in the test session.
os.environ.setdefault("TRITON_INTERPRET", "1")

# Under `pytest -n 2` each worker computes with one torch thread: two workers of two threads each on the
# 2-core CI machine (beside the servers the tests start) made torch-heavy fixtures up to 15x slower.
if os.environ.get("PYTEST_XDIST_WORKER"):
    import torch

    torch.set_num_threads(1)


BENCH_TEST_DIRS = ("bench", "fidelity")


# The two workers of `pytest -n 2` (the README's test command; pytest-xdist) take whole groups of tests
# (GroupScheduling below), in the order of GROUP_ORDER (xdist's reordering by test count is off), each worker
# taking the next group when it is nearly done with its own. The server tests (about two thirds of the suite's
# time) go first, as three groups: the Qwen3-Next SGLang servers (the TP and MTP files compare with the stock
# answers the GDN file records), the other SGLang servers (Kimi Linear, Nemotron-H), and the Ray clusters
# (tests/scheduler, the multi-node cluster included, and the SGLang replicas on Ray, so that no two Ray clusters
# start at once); then the files of minutes; every other file is a group of its own (its module fixtures start
# once), but for the files that share one of tests/native's package servers (conftest.py there), which go
# together. A server file stops its last server when it ends (tests/sglang_server/conftest.py), so a worker
# that goes on to other groups leaves none running. Without -n nothing changes.
SERVER_TEST_DIRS = ("scheduler", "sglang_server")
RAY_SERVER_FILES = ("sglang_server/test_ray_sglang_replicas.py",)
QWEN3_NEXT_SERVER_FILES = ("sglang_server/test_gdn_server.py", "sglang_server/test_mtp_server.py",
                           "sglang_server/test_tp_server.py")
NO_RAY_FILES = ("scheduler/test_engine_http.py",)   # under tests/scheduler, but a group of its own: no Ray cluster
SLOW_FILES = ("kernels/test_compile_sm90.py", "fidelity/test_error_trend.py")   # single groups of minutes
GROUP_ORDER = ("servers-sglang-qwen3-next", "servers-sglang", "servers-ray", *SLOW_FILES)
SHARED_FIXTURE_FILES = {"native/test_server.py": "native-openai-server",
                        "native/test_openai_params.py": "native-openai-server",
                        "native/test_request_limits.py": "native-shared-server",
                        "native/test_soak.py": "native-shared-server"}
HERE = pathlib.Path(__file__).resolve().parent


def _group(rel: pathlib.PurePath) -> str:
    """The group of a test file, by its path under tests/."""
    if rel.as_posix() in NO_RAY_FILES:
        return rel.as_posix()
    if rel.parts[0] == "scheduler" or rel.as_posix() in RAY_SERVER_FILES:
        return "servers-ray"
    if rel.as_posix() in QWEN3_NEXT_SERVER_FILES:
        return "servers-sglang-qwen3-next"
    if rel.parts[0] in SERVER_TEST_DIRS:
        return "servers-sglang"
    return SHARED_FIXTURE_FILES.get(rel.as_posix(), rel.as_posix())


def _order(rel: pathlib.PurePath) -> int:
    """Where a file's group starts in the queue: GROUP_ORDER's groups first, then the rest in collection order."""
    g = _group(rel)
    return GROUP_ORDER.index(g) if g in GROUP_ORDER else len(GROUP_ORDER)


def _rel(item) -> pathlib.Path:
    return pathlib.Path(item.path).resolve().relative_to(HERE)


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling (whole scopes to one worker, in collection order) with our groups as the
    scopes. (Its `xdist_group` marks do not group under pytest 9: they rename node ids, which pytest 9 no
    longer takes.)"""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False   # our order (pytest_collection_modifyitems), not xdist's by test count

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = pathlib.PurePosixPath(nodeid.split("::", 1)[0])
            return _group(path.relative_to(path.parts[0]))   # nodeids start at the rootdir: tests/...

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """The tests of bench/ and tools/ (tests/bench, tests/fidelity) carry the `bench` marker
    (pyproject.toml): `-m "not bench"` leaves them out; CI runs everything. The groups are queued by ``_order``
    (a stable sort: inside a group every test keeps its place)."""
    for item in items:
        if _rel(item).parts[0] in BENCH_TEST_DIRS:
            item.add_marker(pytest.mark.bench)
    items.sort(key=lambda item: _order(_rel(item)))
