"""What launch plans need to know of the device: its streaming multiprocessor count (imports only torch, so
that any module may ask before or after Triton is imported)."""
from __future__ import annotations

import functools

import torch

# an H200's SM count, so that CPU runs (TRITON_INTERPRET) take the decisions the GPU takes
CPU_SM_COUNT = 132


@functools.lru_cache(maxsize=None)
def sm_count(device) -> int:
    """Streaming multiprocessors of a CUDA device; CPU_SM_COUNT for any other device."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_SM_COUNT
