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
# (GroupScheduling below). The server tests (about two thirds of the suite's time) are two groups, one per
# worker, run first, each in its usual order: the Ray clusters (tests/scheduler, the multi-node cluster
# included, and the SGLang replicas on Ray, so that no two Ray clusters start at once) and the other real
# SGLang servers (tests/sglang_server); every other file is a group of its own (its
# module fixtures start once), but for the files that share one of tests/native's package servers
# (conftest.py there), which go together, and the workers take them as they come free. Without -n nothing
# changes.
SERVER_TEST_DIRS = ("scheduler", "sglang_server")
RAY_SERVER_FILES = ("sglang_server/test_ray_sglang_replicas.py",)
NO_RAY_FILES = ("scheduler/test_engine_http.py",)   # under tests/scheduler, but a group of its own: no Ray cluster
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
    if rel.parts[0] in SERVER_TEST_DIRS:
        return "servers-sglang"
    return SHARED_FIXTURE_FILES.get(rel.as_posix(), rel.as_posix())


def _rel(item) -> pathlib.Path:
    return pathlib.Path(item.path).resolve().relative_to(HERE)


def pytest_xdist_make_scheduler(config, log):
    """xdist's scope scheduling (whole scopes to one worker, in collection order) with our groups as the
    scopes. (Its `xdist_group` marks do not group under pytest 9: they rename node ids, which pytest 9 no
    longer takes.)"""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = pathlib.PurePosixPath(nodeid.split("::", 1)[0])
            return _group(path.relative_to(path.parts[0]))   # nodeids start at the rootdir: tests/...

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    """The tests of bench/ and tools/ (tests/bench, tests/fidelity) carry the `bench` marker
    (pyproject.toml): `-m "not bench"` leaves them out; CI runs everything. The server group goes first
    (a stable sort: every other test keeps its place)."""
    for item in items:
        if _rel(item).parts[0] in BENCH_TEST_DIRS:
            item.add_marker(pytest.mark.bench)
    items.sort(key=lambda item: _rel(item).parts[0] not in SERVER_TEST_DIRS)
