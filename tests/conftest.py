import os

# Triton kernels run under the interpreter on CPU machines (CI has no GPU). Must be set before triton
# is imported anywhere in the test session.
os.environ.setdefault("TRITON_INTERPRET", "1")


BENCH_TEST_DIRS = ("bench", "fidelity")


def pytest_collection_modifyitems(config, items):
    """The tests of bench/ and tools/ (tests/bench, tests/fidelity) carry the `bench` marker
    (pyproject.toml): `-m "not bench"` leaves them out; CI runs everything."""
    import pathlib

    import pytest

    here = pathlib.Path(__file__).resolve().parent
    for item in items:
        rel = pathlib.Path(item.path).resolve().relative_to(here)
        if rel.parts[0] in BENCH_TEST_DIRS:
            item.add_marker(pytest.mark.bench)
