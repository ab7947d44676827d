"""The target's Triton backend runs the grouped tree-verify attention (default; ``DDTREE_TREE_ATTENTION=0``: SGLang's).

The switch wraps the backend's ``extend_attention_fwd`` attribute (``hooks.install_tree_attention``)
before the target captures its verify graphs (``after_get_spec_info``) and in the worker; these tests
pin when it does and does not, and (statically, from the installed SGLang sources) the backend facts
the wrapper rests on.
"""

from __future__ import annotations

import types

import pytest

from sglang_overlay import knobs
from sglang_overlay.adapter import hooks
from sglang_overlay.kernels import tree_attention as ta

from ._helpers import plugin_in_process, requires_sglang  # noqa: F401 - fixture
from .test_resolution import _graph_runner, draft_dir, env  # noqa: F401 - fixtures
from .test_worker_static import module_source


class TritonAttnBackend:  # the name the hook accepts; SGLang sets the attribute per instance
    def __init__(self):
        self.extend_attention_fwd = lambda *a, **k: "sglang"


class FlashInferAttnBackend(TritonAttnBackend):
    pass


def test_on_by_default_and_off_with_the_switch(monkeypatch):
    monkeypatch.setenv(knobs.TREE_ATTENTION.name, "0")
    backend = TritonAttnBackend()
    assert hooks.install_tree_attention(backend) == 0
    assert not getattr(backend.extend_attention_fwd, ta.WRAPPED, False)
    monkeypatch.delenv(knobs.TREE_ATTENTION.name, raising=False)
    assert hooks.install_tree_attention(backend, None) == 1
    assert getattr(backend.extend_attention_fwd, ta.WRAPPED, False)
    assert hooks.install_tree_attention(backend) == 0  # never wrapped twice
    assert backend.extend_attention_fwd.__wrapped__(1) == "sglang"


def test_other_backends_are_left_alone(monkeypatch):
    monkeypatch.delenv(knobs.TREE_ATTENTION.name, raising=False)
    other = FlashInferAttnBackend()
    assert hooks.install_tree_attention(other) == 0
    assert not getattr(other.extend_attention_fwd, ta.WRAPPED, False)


@requires_sglang
@pytest.mark.usefixtures("plugin_in_process")
def test_the_target_is_wrapped_before_its_verify_graphs_are_captured(env, draft_dir, monkeypatch):  # noqa: F811
    monkeypatch.delenv(knobs.TREE_ATTENTION.name, raising=False)
    monkeypatch.delenv(knobs.EAGER_TREE_VERIFY.name, raising=False)
    runner = _graph_runner(draft_dir)
    runner.attn_backend = TritonAttnBackend()
    runner.model_runner.attn_backend = TritonAttnBackend()
    hooks.after_get_spec_info(types.SimpleNamespace(custom_mask=None), runner, 64)
    assert getattr(runner.attn_backend.extend_attention_fwd, ta.WRAPPED, False)
    assert getattr(runner.model_runner.attn_backend.extend_attention_fwd, ta.WRAPPED, False)
    # A DFLASH server's target: nothing wrapped.
    dflash = _graph_runner(draft_dir, "DFLASH")
    dflash.attn_backend = TritonAttnBackend()
    hooks.after_get_spec_info(types.SimpleNamespace(custom_mask=None), dflash, 64)
    assert not getattr(dflash.attn_backend.extend_attention_fwd, ta.WRAPPED, False)


@requires_sglang
def test_sglangs_triton_backend_calls_the_attribute_as_the_wrapper_expects():
    # The backend sets extend_attention_fwd per instance and forward_extend reaches it through
    # _forward_extend_kernel with these positional arguments (the wrapper's order).
    src = module_source("sglang.srt.layers.attention.triton_backend").read_text(encoding="utf-8")
    assert "self.extend_attention_fwd = torch.compiler.disable(extend_attention_fwd)" in src
    assert "return self.extend_attention_fwd(*args, **kwargs)" in src
    call = src[src.index("        self._forward_extend_kernel(\n            layer,") :]
    call = call[: call.index("        return o")]
    order = [
        "q.view(",
        "k.contiguous()",
        "v.contiguous()",
        "o.view(",
        "get_key_buffer",
        "get_value_buffer",
        "qo_indptr",
        "kv_indptr",
        "kv_indices",
        "custom_mask",
        "causal",
        "mask_indptr",
        "max_extend_len",
        "k_descale",
        "v_descale",
        "layer.scaling",
    ]
    at = [call.index(token) for token in order]
    assert at == sorted(at), "the backend's argument order changed"
    # The tree verify's mask: FULL layout, rows of prefix + W, found through mask_indptr; the prefix
    # columns are never read by SGLang's kernel (skip_prefix_custom_mask defaults to True and the
    # backend does not pass it), which is what the grouped kernel reproduces.
    assert "seq_mask_len = num_tokens_per_req * (seq_lens + num_tokens_per_req)" in src
    assert "skip_prefix_custom_mask" not in src
    ext = module_source("sglang.kernels.ops.attention.extend_attention").read_text(encoding="utf-8")
    assert "    skip_prefix_custom_mask=True,\n" in ext
    params = ext[ext.index("def extend_attention_fwd(") :]
    params = params[: params.index("):")]
    names = [p.strip().split("=")[0].split(":")[0] for p in params[len("def extend_attention_fwd(") :].split(",")]
    assert names[:16] == [
        "q_extend",
        "k_extend",
        "v_extend",
        "o_extend",
        "k_buffer",
        "v_buffer",
        "qo_indptr",
        "kv_indptr",
        "kv_indices",
        "custom_mask",
        "is_causal",
        "mask_indptr",
        "max_len_extend",
        "k_scale",
        "v_scale",
        "sm_scale",
    ]


@pytest.mark.parametrize("name", ["TritonAttnBackend"])
def test_the_accepted_backend_names(name):
    assert name in hooks.TREE_ATTENTION_BACKENDS
