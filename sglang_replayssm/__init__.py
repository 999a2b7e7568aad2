"""ReplaySSM decoding for hybrid SSM+attention LLMs.

See docs/layout.md for the tensor layout shared by the reference, the pool and the kernels.
Importing this package must not import sglang or ray (the GPU benchmark machine has neither).
"""

__version__ = "0.1.0"
