"""Loading a script of bench/ (not a package) as a module, for the tests that check what it measures."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def load_bench(relpath: str):
    """bench/<relpath> (e.g. "plugin_op_counts.py") as a fresh module named after the file."""
    path = ROOT / "bench" / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
