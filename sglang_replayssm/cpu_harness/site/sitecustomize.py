"""Loaded by every Python process whose path has this folder first (the CPU harness puts it on
``PYTHONPATH`` for SGLang's launcher and the schedulers it spawns): installs the CPU bridge before
SGLang is imported. See ``sglang_replayssm/cpu_harness/__init__.py``."""

from sglang_replayssm.cpu_harness.bridge import install

install()
