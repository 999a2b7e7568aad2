import os
import pathlib

import pytest

# Triton kernels run under the interpreter on CPU machines (CI has no GPU). Must be set before triton
# is imported anywhere in the test session.
os.environ.setdefault("TRITON_INTERPRET", "1")


BENCH_TEST_DIRS = ("bench", "fidelity")


# The two workers of `pytest -n 2 --dist loadgroup` (the README's test command; pytest-xdist) take whole
# groups: the server tests (a Ray cluster, then one real SGLang server after another: about half the suite)
# are one group, run first and alone on one worker, in their usual order; every other file is a group of
# its own (its module fixtures start once), but for the files that share one of tests/native's package
# servers (conftest.py there), which go together. Without -n the groups change nothing.
SERVER_TEST_DIRS = ("scheduler", "sglang_server")
SHARED_FIXTURE_FILES = {"native/test_server.py": "native-openai-server",
                        "native/test_openai_params.py": "native-openai-server",
                        "native/test_request_limits.py": "native-shared-server",
                        "native/test_soak.py": "native-shared-server"}


def _group(rel) -> str:
    if rel.parts[0] in SERVER_TEST_DIRS:
        return "servers"
    return SHARED_FIXTURE_FILES.get(rel.as_posix(), rel.as_posix())


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """The tests of bench/ and tools/ (tests/bench, tests/fidelity) carry the `bench` marker
    (pyproject.toml): `-m "not bench"` leaves them out; CI runs everything. Every test gets its
    `xdist_group` (above), and the server group goes first."""
    here = pathlib.Path(__file__).resolve().parent
    rels = {}
    for item in items:
        rel = pathlib.Path(item.path).resolve().relative_to(here)
        rels[item.nodeid] = rel
        if rel.parts[0] in BENCH_TEST_DIRS:
            item.add_marker(pytest.mark.bench)
        item.add_marker(pytest.mark.xdist_group(_group(rel)))
    items.sort(key=lambda item: rels[item.nodeid].parts[0] not in SERVER_TEST_DIRS)   # stable
