"""Shared test setup for the lab runtime's suite (CPU only, in the overlay's test venv)."""

import os

import pytest

# No GPU on development/CI machines: any Triton kernel must run in Triton's interpreter. Triton reads
# this when a kernel is decorated, so set it before any test module imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")


@pytest.fixture(scope="session", autouse=True)
def _one_torch_thread():
    """The machines are small and shared; tiny models are many times faster on one thread.

    A fixture, not an import at the top of this file: it then runs only in the processes that run
    tests, and not in pytest-xdist's controller, which runs none and would import torch (~3 CPU s)
    for nothing."""
    try:
        import torch
    except ImportError:
        return
    torch.set_num_threads(1)
