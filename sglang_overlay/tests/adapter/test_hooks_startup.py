"""The start-up hooks: the graph-capture hook only where torch is built for CUDA.

On a CPU build SGLang's graph runner package does not import; a hook registered on it makes
HookRegistry print a traceback at every start (which the health gate reads as a crash, and which
broke the lab's starts once).
"""

from __future__ import annotations

import types

import pytest

from sglang_overlay.adapter import hooks

from ._helpers import requires_sglang

pytestmark = requires_sglang


@pytest.fixture
def registered(monkeypatch):
    from sglang.srt.plugins.hook_registry import HookRegistry

    targets = []
    monkeypatch.setattr(HookRegistry, "register", classmethod(lambda cls, target, *a, **k: targets.append(target)))
    return targets


@pytest.mark.parametrize("cuda, expected", [(None, False), ("13.0", True)])
def test_the_graph_capture_hook_is_registered_only_on_a_cuda_build(monkeypatch, registered, cuda, expected):
    import torch

    monkeypatch.setattr(torch, "version", types.SimpleNamespace(cuda=cuda))
    assert hooks.cuda_build() is expected
    hooks.register_startup_hooks()
    assert (hooks.TARGET_GRAPH_SPEC_INFO in registered) is expected
    assert (hooks.TARGET_CONV_WINDOW_DEDUP in registered) is expected
    # The flag and worker hooks are needed in every process, on every build.
    assert {hooks.TARGET_ADD_CLI_ARGS, hooks.TARGET_FROM_CLI_ARGS} <= set(registered)
    from sglang_overlay.adapter import algorithm

    algorithm.register_worker_selection()
    assert hooks.TARGET_CREATE_WORKER in registered
