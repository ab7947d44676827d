# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The GPUs the overlay's Triton kernels are compiled and checked for, with each GPU's limits.

One declaration, read by two sides:
- `scripts/test kernels` (sglang_overlay/scripts/check-kernels) compiles every overlay kernel, as the
  services launch it, for each compute capability here (and each one the repository's inventories
  declare), and fails a kernel whose shared memory or registers exceed that GPU's limits
  (`resource_problems`);
- the preflight role refuses a DDTREE service on a GPU whose compute capability is not here
  (`ddtree_gpu_problems`, through the `ddtree.sglang.kernel_gpu_problems` filter), before anything
  changes on the host.

Plain Python with no Ansible import: the kernel check loads this file by its path in the overlay's venv.
"""

from __future__ import annotations

# Per compute capability: what one thread block may use (CUDA C Programming Guide, "Technical
# Specifications per Compute Capability"): shared memory per block with the opt-in (static and dynamic
# together), 32-bit registers per block (and per SM) and per thread. The keys are the compute
# capabilities the kernels are compiled for: 8.6 (RTX A6000, group ampere), 9.0 (H200, where the GPU
# tests run: tests/gpu_sglang), 12.0 (RTX PRO 6000 Blackwell, group blackwell). A GPU joins by a row here.
KERNEL_GPUS = {
    "8.6": {"shared_bytes_per_block": 101376, "registers_per_block": 65536, "registers_per_thread": 255},
    "9.0": {"shared_bytes_per_block": 232448, "registers_per_block": 65536, "registers_per_thread": 255},
    "12.0": {"shared_bytes_per_block": 101376, "registers_per_block": 65536, "registers_per_thread": 255},
}
# Registers are given to a warp in units of 256 (each thread's count rounded up to a multiple of 8).
REGISTER_ALLOCATION_UNIT = 256
WARP_SIZE = 32
# The speculative algorithms whose services load the overlay and so run its kernels.
KERNEL_ALGORITHMS = ("DDTREE",)


def kernel_capabilities() -> list[str]:
    """The compute capabilities the kernels are compiled for, in numeric order ("8.6", "9.0", "12.0")."""
    return sorted(KERNEL_GPUS, key=capability_number)


def capability_number(capability: str) -> int:
    """ "12.0" -> 120, Triton's form of a compute capability (GPUTarget("cuda", 120, 32))."""
    major, minor = (str(capability).split(".") + ["0"])[:2]
    return int(major) * 10 + int(minor or 0)


def registers_per_block(registers_per_thread: int, num_warps: int) -> int:
    """Registers a block of num_warps warps takes, as the hardware allocates them (per warp, in units)."""
    per_warp = registers_per_thread * WARP_SIZE
    per_warp = -(-per_warp // REGISTER_ALLOCATION_UNIT) * REGISTER_ALLOCATION_UNIT
    return per_warp * num_warps


def resource_problems(kernel: str, capability: str, shared_bytes: int, registers: int, num_warps: int) -> list[str]:
    """What a compiled kernel needs beyond what a GPU of this compute capability gives a block, each
    naming the kernel, the GPU and the resource. An empty list: it launches there."""
    limits = KERNEL_GPUS.get(capability)
    if limits is None:
        return [
            "%s: no limits are declared for compute capability %s; add its row to KERNEL_GPUS "
            "(plugins/module_utils/kernel_targets.py)" % (kernel, capability)
        ]
    problems = []
    if shared_bytes > limits["shared_bytes_per_block"]:
        problems.append(
            "%s on compute capability %s: %d bytes of shared memory per block, over the GPU's %d"
            % (kernel, capability, shared_bytes, limits["shared_bytes_per_block"])
        )
    if registers > limits["registers_per_thread"]:
        problems.append(
            "%s on compute capability %s: %d registers per thread, over the GPU's %d"
            % (kernel, capability, registers, limits["registers_per_thread"])
        )
    block = registers_per_block(registers, num_warps)
    if block > limits["registers_per_block"]:
        problems.append(
            "%s on compute capability %s: %d registers per block (%d per thread x %d warps), over the GPU's %d"
            % (kernel, capability, block, registers, num_warps, limits["registers_per_block"])
        )
    return problems


def ddtree_gpu_problems(services: list, gpus: list, host: str = "host") -> list[str]:
    """Each GPU a DDTREE service (or its tuning's temporary instance) would run on whose compute capability
    the kernels are not compiled for, naming the host, the service, the GPU and the fix.

    services: the sglang_services declarations; gpus: gpu_facts' GPUs (index, name, compute_capability).
    A GPU index the host lacks is left to the check of the services' GPUs."""
    by_index = {gpu.get("index"): gpu for gpu in gpus or []}
    known = ", ".join(kernel_capabilities())
    problems = []
    for service in services or []:
        spec = service.get("speculative") or {}
        algorithm = spec.get("algorithm", "NONE")
        if algorithm not in KERNEL_ALGORITHMS:
            continue
        autotune = spec.get("autotune") if isinstance(spec.get("autotune"), dict) else {}
        indices = list(service.get("gpus") or []) + [
            gpu for gpu in autotune.get("gpus") or [] if gpu not in (service.get("gpus") or [])
        ]
        for index in indices:
            gpu = by_index.get(index)
            if gpu is None or str(gpu.get("compute_capability")) in KERNEL_GPUS:
                continue
            problems.append(
                "%s: service %s runs %s on GPU %s (%s, compute capability %s), but the overlay's kernels are compiled "
                "and checked only for compute capabilities %s; run the service with DFLASH on this host, or add %s "
                "to KERNEL_GPUS in plugins/module_utils/kernel_targets.py (with that GPU's limits) and pass "
                "scripts/test kernels"
                % (
                    host,
                    service.get("name"),
                    algorithm,
                    index,
                    gpu.get("name") or "unknown",
                    gpu.get("compute_capability"),
                    known,
                    gpu.get("compute_capability"),
                )
            )
    return problems
