"""Loaded by every Python process whose path has this folder first (the GPU harness puts it on
``PYTHONPATH`` for SGLang's launcher and the processes it spawns): installs the GPU bridge before
SGLang is imported. See ``sglang_replayssm/gpu_harness/__init__.py``."""

from sglang_replayssm.gpu_harness.bridge import install

install()
