"""Method hooks the adapter registers with SGLang's ``HookRegistry``.

Every target below exists in SGLang 0.5.23 (the plugin loads only there). Each hook changes
behaviour only for a DDTree server (a record carrying DDTree settings, or a batch carrying the
DDTree tree-verify input); any other server, built-in algorithms included, runs SGLang's code.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

TARGET_ADD_CLI_ARGS = "sglang.srt.server_args.ServerArgs.add_cli_args"
TARGET_FROM_CLI_ARGS = "sglang.srt.server_args.ServerArgs.from_cli_args"
TARGET_CREATE_WORKER = "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker"
# Registered lazily by the worker (importing the graph runner pulls in the GPU stack, which
# tokenizer/detokenizer processes should not pay for).
TARGET_CAN_RUN_GRAPH = (
    "sglang.srt.model_executor.runner.decode_cuda_graph_runner.DecodeCudaGraphRunner.can_run_graph"
)
# TARGET_VERIFY is also an "extend" mode that the prefill (piecewise/full) graph runner may take.
TARGET_CAN_RUN_PREFILL_GRAPH = (
    "sglang.srt.model_executor.runner.prefill_cuda_graph_runner.PrefillCudaGraphRunner.can_run_graph"
)
GRAPH_GUARD_TARGETS = (TARGET_CAN_RUN_GRAPH, TARGET_CAN_RUN_PREFILL_GRAPH)

# Attribute that marks the DDTree tree-verify input (see tree_verify.DDTreeVerifyInput).
TREE_VERIFY_MARKER = "ddtree_tree_verify"


def around_create_worker(original, self, server_args, *args, **kwargs):
    """DFLASH + DDTree settings on the record -> the DDTree worker; anything else unchanged."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    from .resolution import resolved_settings

    if self is SpeculativeAlgorithm.DFLASH and resolved_settings(server_args) is not None:
        from .worker import DDTreeWorker

        return DDTreeWorker
    return original(self, server_args, *args, **kwargs)


def around_can_run_graph(original, self, forward_batch, *args, **kwargs):
    """Never replay a CUDA graph (decode or prefill runner) for a DDTree tree verify.

    The TARGET_VERIFY graphs are captured with DFLASH's dummy verify input, which has no custom
    attention mask: a tree replayed through them would silently attend causally (wrong tokens,
    no error). The tree verify therefore always runs eagerly. Other batches (the DFlash draft
    forward, prefill, every other server) get the runner's own decision.
    """
    spec_info = getattr(forward_batch, "spec_info", None)
    if spec_info is not None and getattr(spec_info, TREE_VERIFY_MARKER, False):
        return False
    return original(self, forward_batch, *args, **kwargs)


def register_startup_hooks() -> None:
    """Hooks needed in every process, from the first flag parse on."""
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from .flags import after_add_cli_args, around_from_cli_args

    HookRegistry.register(TARGET_ADD_CLI_ARGS, after_add_cli_args, HookType.AFTER)
    HookRegistry.register(TARGET_FROM_CLI_ARGS, around_from_cli_args, HookType.AROUND)
    HookRegistry.register(TARGET_CREATE_WORKER, around_create_worker, HookType.AROUND)


_graph_guard_installed = False


def install_graph_guard() -> None:
    """Register and apply the CUDA-graph guard (called by the worker, in the scheduler process)."""
    global _graph_guard_installed
    if _graph_guard_installed:
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    for target in GRAPH_GUARD_TARGETS:
        HookRegistry.register(target, around_can_run_graph, HookType.AROUND)
    HookRegistry.apply_hooks()
    missing = [t for t in GRAPH_GUARD_TARGETS if t not in HookRegistry._patched]
    if missing:
        raise RuntimeError(
            f"DDTREE could not install its CUDA-graph guard on {missing}; refusing to run a tree "
            "verify that a captured graph could replay causally"
        )
    _graph_guard_installed = True


def hooks_applied() -> dict[str, bool]:
    """Which of the adapter's hook targets HookRegistry has patched (for diagnostics)."""
    from sglang.srt.plugins.hook_registry import HookRegistry

    targets = [TARGET_ADD_CLI_ARGS, TARGET_FROM_CLI_ARGS, TARGET_CREATE_WORKER, *GRAPH_GUARD_TARGETS]
    return {t: t in HookRegistry._patched for t in targets}
