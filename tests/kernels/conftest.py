"""Kernel tests run on CPU through Triton's interpreter. TRITON_INTERPRET must be set before
triton is first imported in the process (triton binds its own tl.* helpers at import time), so it
is set here, at collection, when no GPU is present."""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
