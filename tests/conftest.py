import os

# Triton kernels run under the interpreter on CPU machines (CI has no GPU). Must be set before triton
# is imported anywhere in the test session.
os.environ.setdefault("TRITON_INTERPRET", "1")
