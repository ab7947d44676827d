"""Hybrid targets (issue 56): the layout table, the classification and the tree-state memory check.

Pure Python, like ``adapter.hybrid``: no torch or sglang. The GDN shapes are those of the published
``config.json`` files as SGLang's ``Qwen3NextConfig.mamba2_cache_params`` reads them.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from pathlib import Path

import pytest

from sglang_overlay.adapter import hybrid as h
from sglang_overlay.adapter import settings as s

GIB, MIB = 1 << 30, 1 << 20

# Qwen/Qwen3.5-27B config.json, text_config (the fields SGLang reads): 64 layers, 3 GDN : 1 full.
QWEN35_27B = {
    "model_type": "qwen3_5",
    "text_config": {
        "model_type": "qwen3_5_text",
        "num_hidden_layers": 64,
        "layer_types": (["linear_attention"] * 3 + ["full_attention"]) * 16,
        "full_attention_interval": 4,
        "linear_conv_kernel_dim": 4,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 48,
        "mamba_ssm_dtype": "float32",
    },
}
# Qwen/Qwen3-Next-80B-A3B-Instruct config.json: 48 layers, full attention every 4th (no layer_types).
QWEN3_NEXT_80B = {
    "model_type": "qwen3_next",
    "num_hidden_layers": 48,
    "full_attention_interval": 4,
    "linear_conv_kernel_dim": 4,
    "linear_key_head_dim": 128,
    "linear_value_head_dim": 128,
    "linear_num_key_heads": 16,
    "linear_num_value_heads": 32,
}


# --- the table and the classification -------------------------------------------------------------


def test_the_table_covers_the_installed_sglangs_hybrid_arch():
    # Read from the installed source, not imported (as test_worker_static does).
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("sglang is not installed")
    source = Path(list(spec.submodule_search_locations)[0]) / "srt" / "configs" / "hybrid_arch.py"
    tree = ast.parse(source.read_text(encoding="utf-8"))
    imported = {
        a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "sglang.srt.configs"
        for a in n.names
    }
    assert len(imported) > 20 and imported <= set(h.CONFIG_LAYOUTS), sorted(imported - set(h.CONFIG_LAYOUTS))


def test_every_config_class_of_sglangs_hybrid_arch_is_in_the_table():
    # configs/hybrid_arch.py of SGLang 0.5.23 (mamba2_config, hybrid_gdn_config, kimi_linear_config,
    # hybrid_lightning_config) and the linear-attn registry's GigaChat35Config.
    named = {
        "BailingHybridConfig",
        "FalconH1Config",
        "FalconMambaConfig",
        "GraniteMoeHybridConfig",
        "InklingMMConfig",
        "InklingModelConfig",
        "InternS2PreviewConfig",
        "JetNemotronConfig",
        "JetVLMConfig",
        "KimiLinearConfig",
        "Lfm2Config",
        "Lfm2MoeConfig",
        "Lfm2VlConfig",
        "Mamba2Config",
        "MambaConfig",
        "MiniCPMHybridConfig",
        "NemotronH_Nano_VL_V2_Config",
        "NemotronHConfig",
        "Qwen3_5Config",
        "Qwen3_5MoeConfig",
        "Qwen3NextConfig",
        "ZayaConfig",
        "GigaChat35Config",
        "Glm5NextConfig",
    }
    assert named <= set(h.CONFIG_LAYOUTS)
    # mambaish_config returns the text config for GDN and GLM5-Next: those names classify too.
    for text in ("Qwen3_5TextConfig", "Qwen3_5MoeTextConfig", "Glm5NextTextConfig"):
        assert text in h.CONFIG_LAYOUTS


@pytest.mark.parametrize(
    "name, kwargs, status, layout",
    [
        ("Qwen3NextConfig", {}, h.TREE, "GDN"),
        ("Qwen3_5TextConfig", {}, h.TREE, "GDN"),
        ("Qwen3_5MoeTextConfig", {}, h.TREE, "GDN"),
        ("GigaChat35Config", {}, h.TREE, "GDN"),
        ("NemotronHConfig", {}, h.TREE, "Mamba2"),
        ("FalconH1Config", {}, h.TREE, "Mamba2"),
        ("KimiLinearConfig", {}, h.TREE, "KDA"),
        ("KimiLinearConfig", {"linear_attn_verify_backend": "triton"}, h.TREE, "KDA"),
        ("KimiLinearConfig", {"linear_attn_verify_backend": "flashinfer"}, h.REFUSED, "KDA"),
        ("BailingHybridConfig", {"use_kda": True}, h.TREE, "KDA"),
        ("BailingHybridConfig", {"use_kda": False}, h.REFUSED, "Lightning"),
        ("BailingHybridConfig", {}, h.REFUSED, None),
        ("MiniCPMHybridConfig", {}, h.REFUSED, "Lightning"),
        ("Lfm2Config", {}, h.REFUSED, "ShortConv"),
        ("ZayaConfig", {}, h.REFUSED, "ShortConv"),
        ("InklingMMConfig", {}, h.REFUSED, "Inkling"),
        ("Qwen3NextConfig", {"replayssm_spec": True}, h.REFUSED, "GDN"),
        ("SomethingNewConfig", {}, h.REFUSED, None),
    ],
)
def test_classify(name, kwargs, status, layout):
    got = h.classify_hybrid(name, **kwargs)
    assert (got.status, got.layout, got.refused) == (status, layout, status != h.TREE)
    assert name in got.message and got.reason in got.message
    if status == h.REFUSED:
        assert got.message.startswith(f"DDTREE refuses the hybrid target {name} ({layout or 'unknown layout'}): ")
        assert got.proven == h.NOTHING_TO_PROVE
    else:
        assert got.message.startswith(f"DDTREE verifies the hybrid target {name} ({layout}) as a tree")
        assert "never run on a GPU" in got.message and got.proven == h.NOT_PROVEN_ON_GPU


def test_the_refusal_messages():
    assert h.classify_hybrid("BailingHybridConfig", use_kda=False).message == (
        "DDTREE refuses the hybrid target BailingHybridConfig (Lightning): SGLang's Lightning (seg_la) backend "
        "verifies a draft tree as a chain and raises NotImplementedError for speculative decoding with topk > 1; "
        "no parent-pointer path."
    )
    assert "recurrent_kda" in h.classify_hybrid("KimiLinearConfig", linear_attn_verify_backend="flashinfer").message


def test_nothing_is_marked_proven_on_a_gpu():
    for layout in h.LAYOUTS:
        assert "never run on a GPU" in layout.proven or layout.status == h.REFUSED
        assert layout.status in (h.TREE, h.REFUSED) and layout.reason and layout.source


def test_the_layout_table_says_per_layout_what_runs_and_what_is_proven():
    """layout_table (what spec_verify reports): every layout once, JSON-plain, its config classes those the
    classification maps to it; a tree layout says what is proven, a refused one why."""
    table = h.layout_table()
    assert [row["name"] for row in table] == [layout.name for layout in h.LAYOUTS]
    assert json.loads(json.dumps(table)) == table
    for row in table:
        assert row["config_classes"] == sorted(n for n, of in h.CONFIG_LAYOUTS.items() if of.name == row["name"])
        assert row["status"] in (h.TREE, h.REFUSED) and row["reason"] and row["proven"]
    by_name = {row["name"]: row for row in table}
    assert by_name["GDN"]["status"] == h.TREE and "Qwen3_5Config" in by_name["GDN"]["config_classes"]
    assert by_name["GDN"]["proven"] == h.NOT_PROVEN_ON_GPU
    assert by_name["Lightning"]["status"] == h.REFUSED and by_name["Lightning"]["proven"] == h.NOTHING_TO_PROVE


def test_the_module_imports_neither_torch_nor_sglang():
    tree = ast.parse(Path(h.__file__).read_text(encoding="utf-8"))
    names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and not n.level}
    assert not {n for n in names if re.match(r"(torch|sglang|numpy)\b", n)}


# --- state shapes and memory ----------------------------------------------------------------------


def test_qwen35_27b_state_shapes():
    shapes = h.gdn_state_shapes(QWEN35_27B)
    # conv: value 48*128 + 2 * 16 keys * 128 = 10240 channels x (4 - 1); temporal (48, 128, 128) fp32.
    assert shapes.conv == ((10240, 3),) and shapes.temporal == (48, 128, 128) and shapes.num_layers == 48
    assert shapes.layer_bytes == 10240 * 3 * 2 + 48 * 128 * 128 * 4 == 3_207_168
    assert shapes.per_request_bytes == 153_944_064  # SGLang's mamba_cache_per_req, 146.8 MiB
    tp4 = h.gdn_state_shapes(QWEN35_27B, tp_size=4)
    assert tp4.conv == ((2560, 3),) and tp4.temporal == (12, 128, 128)


def test_qwen3_next_80b_state_shapes():
    shapes = h.gdn_state_shapes(QWEN3_NEXT_80B)
    assert shapes.conv == ((8192, 3),) and shapes.temporal == (32, 128, 128) and shapes.num_layers == 36
    assert shapes.per_request_bytes == 36 * (8192 * 3 * 2 + 32 * 128 * 128 * 4) == 77_266_944  # 73.7 MiB


def test_tree_state_bytes_is_one_snapshot_per_node_per_linear_layer():
    shapes = h.gdn_state_shapes(QWEN35_27B, tp_size=4)
    est = h.tree_state_bytes(shapes, window=64, max_running_requests=48, block=16)
    assert est.snapshots_per_request == 64 * 48
    assert est.bytes_per_request == 64 * shapes.per_request_bytes
    assert est.total_bytes == 49 * 64 * shapes.per_request_bytes == 120_692_146_176  # 112.4 GiB
    assert est.block_bytes == 49 * 16 * shapes.per_request_bytes and est.extra_bytes == est.total_bytes * 3 // 4
    at_block = h.tree_state_bytes(shapes, window=16, max_running_requests=48, block=16)
    assert at_block.extra_bytes == 0 and at_block.total_bytes == 30_173_036_544  # 28.1 GiB, DFLASH's own


def test_nemotron_h_mamba2_shapes():
    cfg = {
        "mamba_num_heads": 128,
        "mamba_head_dim": 64,
        "n_groups": 8,
        "ssm_state_size": 128,
        "conv_kernel": 4,
        "hybrid_override_pattern": "M-M-M*-M-",
    }
    shapes = h.mamba2_state_shapes(cfg, tp_size=2)
    assert shapes.conv == (((128 * 64 + 2 * 8 * 128) // 2, 3),) and shapes.temporal == (64, 64, 128)
    assert shapes.num_layers == 4


def resolved(budget):
    return s.resolve_for_window(s.resolve_settings({s.DEST_BUDGET: budget}, environ={}), 16)


def test_check_tree_state_memory_refuses_and_names_the_largest_budget_that_fits():
    shapes = h.gdn_state_shapes(QWEN3_NEXT_80B, tp_size=4)
    limit = 40 * GIB
    with pytest.raises(s.DDTreeConfigError) as err:
        h.check_tree_state_memory(shapes, resolved(63), s.FLAG_BUDGET, 48, limit)
    text = str(err.value)
    assert text.startswith(f"{s.FLAG_BUDGET} 63 needs a verify window of 64 tokens")
    assert "56.4 GiB, over the 40.0 GiB" in text and "2304 per request" in text
    fits = int(text.split("largest single budget that fits is ")[1].split(";")[0])
    assert fits == 44  # 45 slots x 49 request slots x 18.4 MiB = 39.7 GiB <= 40 GiB < 46 x ...
    assert h.check_tree_state_memory(shapes, resolved(fits), s.FLAG_BUDGET, 48, limit).total_bytes <= limit
    with pytest.raises(s.DDTreeConfigError):
        h.check_tree_state_memory(shapes, resolved(fits + 1), s.FLAG_BUDGET, 48, limit)
    # A schedule is judged by its widest window: SGLang sizes the pool once.
    with pytest.raises(s.DDTreeConfigError, match="1:63,48:7 needs a verify window of 64"):
        h.check_tree_state_memory(shapes, resolved("1:63,48:7"), s.ENV_BUDGET, 48, limit)


def test_check_tree_state_memory_when_not_even_the_block_fits():
    shapes = h.gdn_state_shapes(QWEN35_27B)
    with pytest.raises(s.DDTreeConfigError, match="largest single budget that fits is 0;"):
        h.check_tree_state_memory(shapes, resolved(31), s.FLAG_BUDGET, 48, 40 * GIB)
    small = h.check_tree_state_memory(shapes, resolved(15), s.FLAG_BUDGET, 4, 40 * GIB)
    assert small.total_bytes == 5 * 16 * 153_944_064
