"""Shared test setup for the overlay's suite (CPU only)."""

import os

# No GPU on development/CI machines: any Triton kernel (SGLang's own, in comparison tests) must
# run in Triton's interpreter. Triton reads this when a kernel is decorated, so set it before any
# test module imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import torch
except ImportError:  # the pure-Python heap tests still run
    torch = None

if torch is not None:
    # The machines are small and shared; tiny models are many times faster on one thread than
    # fighting for two.
    torch.set_num_threads(1)
