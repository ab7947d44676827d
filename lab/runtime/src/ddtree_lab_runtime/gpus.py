"""GPU presence in the lab: make the lab's ``nvidia-smi`` list this process as a holder of its GPUs.

The lab's ``nvidia-smi`` (lab/nvidia-smi/nvidia-smi) lists every process whose environment has
``LAB_NVIDIA_GPUS=<indices>``. A process's environment is fixed at exec time, so at startup the
runtime re-executes itself once (``os.execve``: same PID, same command line) with that variable
set, when ``CUDA_VISIBLE_DEVICES`` is set and ``LAB_NVIDIA_GPUS`` is not. The indices are the GPUs
SGLang would use: ``tp x pp x dp`` devices from ``--base-gpu-id`` every ``--gpu-id-step``, taken
from the visible list (``CUDA_VISIBLE_DEVICES=1,3`` and ``--tp-size 1`` -> ``LAB_NVIDIA_GPUS=1``).
This module uses only the standard library: it runs before anything heavy is imported.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Mapping, Optional, Sequence

ENV_HELD = "LAB_NVIDIA_GPUS"
ENV_VISIBLE = "CUDA_VISIBLE_DEVICES"


def _layout(argv: Sequence[str]) -> tuple[int, int, int]:
    """(number of GPUs, base id, step) from the flags SGLang uses for device placement."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--tp-size", "--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--pp-size", "--pipeline-parallel-size", type=int, default=1)
    parser.add_argument("--dp-size", "--data-parallel-size", type=int, default=1)
    parser.add_argument("--base-gpu-id", type=int, default=0)
    parser.add_argument("--gpu-id-step", type=int, default=1)
    try:
        args, _ = parser.parse_known_args(list(argv))
    except (SystemExit, ValueError):  # the real parser will report bad flags
        return 1, 0, 1
    count = max(1, args.tp_size) * max(1, args.pp_size) * max(1, args.dp_size)
    return count, max(0, args.base_gpu_id), max(1, args.gpu_id_step)


def held_gpus(visible: str, argv: Sequence[str]) -> list[str]:
    """Physical GPU indices (as in ``CUDA_VISIBLE_DEVICES``) this server would hold."""
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    count, base, step = _layout(argv)
    chosen = [entries[i] for i in (base + k * step for k in range(count)) if i < len(entries)]
    return [e for e in chosen if e.isdigit()]


def environment_with_gpus(environ: Mapping[str, str], argv: Sequence[str]) -> Optional[dict]:
    """The environment to re-exec with, or None when no re-exec is needed."""
    visible = environ.get(ENV_VISIBLE)
    if not visible or environ.get(ENV_HELD):
        return None
    gpus = held_gpus(visible, argv)
    if not gpus:
        return None
    env = dict(environ)
    env[ENV_HELD] = ",".join(gpus)
    return env


def reexec_with_gpus() -> None:
    """Re-exec this interpreter once, same PID and command line, with ``LAB_NVIDIA_GPUS`` set."""
    env = environment_with_gpus(os.environ, sys.argv[1:])
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, list(sys.orig_argv), env)
