"""Hybrid targets, what the worker arranges: the plan per layout and flag, SGLang's linear-attention tree
switch on the target's backends, the dense conv-window cache, and the start-up hook that keeps it dense.

The decisions are pure (``hybrid.hybrid_plan``); the arrangements act on SGLang objects, stood in for here
by objects with SGLang's class names and tensor layouts, and checked against SGLang's installed sources
where they depend on them (a GPU runs the real ones: ``tests/gpu_sglang``).
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch

from sglang_overlay.adapter import hooks
from sglang_overlay.adapter import hybrid as h
from sglang_overlay.adapter.resolution import RESOLVED_ATTR
from sglang_overlay.adapter.settings import DDTreeConfigError, ResolvedDDTree

from ._helpers import requires_sglang, site_packages


def sglang_source(relative: str) -> str:
    """An installed SGLang module's source, read without importing it (its GPU stack does not load here)."""
    return (Path(site_packages()) / "sglang" / "srt" / relative).read_text()


# ---- the plan ---------------------------------------------------------------------------------------


def test_not_a_hybrid_needs_no_plan():
    assert h.hybrid_plan(None, allow_unsafe=False) is None


@pytest.mark.parametrize("allow", [False, True])
def test_a_refused_layout_is_refused_or_run_lossy_and_never_gets_tree_state(allow):
    verdict = h.classify_hybrid("Lfm2Config")
    plan = h.hybrid_plan(verdict, allow_unsafe=allow)
    assert plan.tree_state is False
    if allow:
        assert plan.refusal is None and "lossy" in plan.warning and "ShortConv" in plan.warning
    else:
        assert plan.warning is None
        assert "ShortConv" in plan.refusal and h.FLAG_ALLOW_HYBRID in plan.refusal and "lossy" in plan.refusal


@pytest.mark.parametrize("config", ["Qwen3_5TextConfig", "NemotronHConfig"])
def test_a_tree_layout_not_proven_on_a_gpu_needs_the_flag_and_then_gets_tree_state(config):
    verdict = h.classify_hybrid(config)
    refused = h.hybrid_plan(verdict, allow_unsafe=False)
    assert (
        refused.tree_state
        and h.FLAG_ALLOW_HYBRID in refused.refusal
        and "proven on the CPU reference only" in refused.refusal
    )
    allowed = h.hybrid_plan(verdict, allow_unsafe=True)
    assert allowed.refusal is None and allowed.tree_state and "parent's" in allowed.warning


def test_a_tree_layout_proven_on_a_gpu_runs_without_the_flag():
    verdict = h.classify_hybrid("Qwen3_5TextConfig")
    proven = types.SimpleNamespace(**{**verdict.__dict__, "proven": "on a GPU"}, refused=False)
    assert h.hybrid_plan(proven, allow_unsafe=False) == h.HybridPlan(None, True, None)


def test_chain_only_switches_turn_a_tree_layout_into_a_refusal():
    for verdict in (
        h.classify_hybrid("Qwen3_5TextConfig", replayssm_spec=True),
        h.classify_hybrid("KimiLinearConfig", linear_attn_verify_backend="flashinfer"),
    ):
        plan = h.hybrid_plan(verdict, allow_unsafe=True)
        assert plan.tree_state is False and "lossy" in plan.warning


# ---- the linear-attention backends' tree switch ---------------------------------------------------------


class MambaAttnBackendBase:  # SGLang's base class name: the switch finds backends by it
    def __init__(self):
        self.topk = 0


class GDNAttnBackend(MambaAttnBackendBase):
    pass


class TritonAttnBackend:
    topk = 0


class HybridLinearAttnBackend:
    def __init__(self, linear):
        self.full_attn_backend = TritonAttnBackend()
        self.linear_attn_backend = linear


def test_the_switch_sets_topk_on_each_linear_backend_once_and_nothing_else():
    linear, other = GDNAttnBackend(), GDNAttnBackend()
    wrapper = HybridLinearAttnBackend(linear)
    assert hooks.linear_tree_backends(wrapper, None, linear, other) == [linear, other]
    assert hooks.enable_linear_tree_verify(8, wrapper, linear, other) == 2
    assert (linear.topk, other.topk, wrapper.full_attn_backend.topk) == (8, 8, 0)
    assert hooks.enable_linear_tree_verify(8, wrapper) == 0  # already on
    chain = GDNAttnBackend()
    hooks.enable_linear_tree_verify(1, chain)  # a chain takes the tree path too: SGLang's switch is topk > 1
    assert chain.topk == 2


def test_the_planted_chain_state_control_leaves_the_backends_as_dflash_built_them(monkeypatch, caplog):
    monkeypatch.setenv("DDTREE_HYBRID_CHAIN_STATE", "1")
    linear = GDNAttnBackend()
    with caplog.at_level("WARNING"):
        assert hooks.enable_linear_tree_verify(8, HybridLinearAttnBackend(linear)) == 0
    assert linear.topk == 0 and "lossy" in caplog.text


@requires_sglang
def test_sglangs_linear_backends_read_the_switch_as_the_stand_ins_do():
    source = sglang_source("layers/attention/hybrid_linear_attn_backend.py")
    assert f"class {hooks.LINEAR_TREE_BACKEND_BASE}(AttentionBackend):" in source
    assert "class Mamba2AttnBackend(MambaAttnBackendBase):" in source
    gdn = sglang_source("layers/attention/linear/gdn_backend.py")
    assert "class GDNAttnBackend(MambaAttnBackendBase):" in gdn
    assert "self.linear_attn_backend = linear_attn_backend" in source
    assert "self.topk = get_spec().speculative_eagle_topk" in source
    # the tree links are read from the verify input (eager) and copied into the graph buffers (replay)
    assert "if self.topk > 1:" in source and "retrieve_parent_token = torch.empty_like(retrieve_next_token)" in source
    assert 'getattr(spec_info, "retrieve_next_token", None)' in source


# ---- the dense conv-window cache ----------------------------------------------------------------------


def conv_windows(dedup: bool, layers=2, slots=3, tokens=16, dim=8, kernel=4):
    """SGLang's two layouts of ``intermediate_conv_window`` (``MambaPool``): one window per draft token, or
    one shared buffer whose windows overlap (``_allocate_deduplicated_conv_window``)."""
    if not dedup:
        return [torch.zeros(layers, slots, tokens, dim, kernel - 1)]
    phys = torch.zeros(layers, slots, dim, tokens + kernel - 2)
    s = phys.stride()
    return [phys.as_strided((layers, slots, tokens, dim, kernel - 1), (s[0], s[1], 1, s[2], 1))]


def test_dense_windows_are_told_from_the_overlapping_views():
    assert hooks.dense_conv_windows(conv_windows(dedup=False))
    assert not hooks.dense_conv_windows(conv_windows(dedup=True))
    # a pool whose windows are not where SGLang keeps them is not taken for dense
    assert not hooks.dense_conv_windows(None) and not hooks.dense_conv_windows([])


@requires_sglang
def test_sglangs_deduplicated_layout_is_the_overlapping_view():
    source = sglang_source("mem_cache/memory_pool.py")
    assert "def conv_window_dedup_enabled(" in source
    assert source.count("conv_window_dedup_enabled(") >= 2  # declared, and called where the pool is built
    assert ".as_strided(" in source and "intermediate_conv_window=intermediate_conv_window_cache" in source


@requires_sglang
@pytest.mark.parametrize("ddtree, sglang_says, want", [(True, True, False), (False, True, True), (False, False, False)])
def test_a_ddtree_server_keeps_the_dense_windows(monkeypatch, ddtree, sglang_says, want):
    from sglang.srt import runtime_context

    record = types.SimpleNamespace()
    if ddtree:
        setattr(record, RESOLVED_ATTR, ResolvedDDTree(15, 8, True, 16).to_dict())
    monkeypatch.setattr(runtime_context, "get_server_args", lambda: record)
    assert hooks.around_conv_window_dedup(lambda *a, **k: sglang_says, False, False, 1, False) is want


@requires_sglang
def test_without_a_published_record_sglang_decides(monkeypatch):
    from sglang.srt import runtime_context

    def unpublished():
        raise AttributeError("no server args yet")

    monkeypatch.setattr(runtime_context, "get_server_args", unpublished)
    assert hooks.around_conv_window_dedup(lambda *a, **k: True) is True


# ---- the snapshots counted before start -------------------------------------------------------------


def resolution_cfg(tmp_path, config: dict, **fields):
    import json

    (tmp_path / "config.json").write_text(json.dumps(config))
    base = dict(model_path=str(tmp_path), mem_fraction_static=0.8, tp_size=1, max_running_requests=48, device="cuda")
    return types.SimpleNamespace(**{**base, **fields})


QWEN35_LIKE = {  # the GDN fields SGLang reads; 48 linear layers of 64
    "model_type": "qwen3_5",
    "text_config": {
        "num_hidden_layers": 64,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
    },
}


def test_a_budget_whose_snapshots_do_not_fit_one_request_is_refused_before_start(tmp_path, monkeypatch, caplog):
    from sglang_overlay.adapter import resolution

    cfg = resolution_cfg(tmp_path, QWEN35_LIKE)
    per_token = h.state_shapes_of(QWEN35_LIKE).per_request_bytes
    # A static pool whose quarter holds 2 x 64 snapshots: one request (+ the padding slot) at window 64.
    gpu_mib = 2 * 64 * per_token / h.TREE_STATE_SHARE / 0.8 / (1 << 20) * 1.001
    monkeypatch.setattr(resolution, "_gpu_mib", lambda _cfg: gpu_mib)
    with caplog.at_level("INFO"):
        resolution._check_tree_state_memory(cfg, ResolvedDDTree(63, 8, True, 64, 16), "--speculative-ddtree-budget")
    assert "holds about 1 requests' (7 at the drafter's block)" in caplog.text
    with pytest.raises(
        DDTreeConfigError, match=r"--speculative-ddtree-budget 127 .*largest single budget that fits is 6[34]"
    ):
        resolution._check_tree_state_memory(cfg, ResolvedDDTree(127, 8, True, 128, 16), "--speculative-ddtree-budget")


def test_without_a_gpu_query_or_a_hybrid_config_nothing_is_checked(tmp_path, monkeypatch):
    from sglang_overlay.adapter import resolution

    huge = ResolvedDDTree(127, 8, True, 128, 16)
    monkeypatch.setattr(resolution, "_gpu_mib", lambda _cfg: None)
    resolution._check_tree_state_memory(resolution_cfg(tmp_path, QWEN35_LIKE), huge, "X")
    monkeypatch.setattr(resolution, "_gpu_mib", lambda _cfg: 1.0)
    resolution._check_tree_state_memory(resolution_cfg(tmp_path, {"model_type": "qwen3"}), huge, "X")
    assert h.state_shapes_of({"model_type": "lfm2"}) is None
