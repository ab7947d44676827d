"""Shared test setup for the lab runtime's suite (CPU only, in the overlay's test venv)."""

import os

# No GPU on development/CI machines: any Triton kernel must run in Triton's interpreter. Triton reads
# this when a kernel is decorated, so set it before any test module imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")

try:
    import torch
except ImportError:
    torch = None

if torch is not None:
    # The machines are small and shared; tiny models are many times faster on one thread.
    torch.set_num_threads(1)
