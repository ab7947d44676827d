"""DDTREE on hybrid (recurrent + attention) targets: which layouts get a tree verify, and its state memory.

Pure Python: imports neither torch nor sglang (the deploy tooling and resolution use it before any
process starts; ``tests/test_import_graph.py``).

**The rule** (proven on the CPU reference ``reference/hybrid.py``; docs/adapter.md says what a GPU has not shown):
a tree verify gives every node the recurrent state computed from its *parent's* state, never from
whatever its predecessor in the verify window left; the commit keeps the snapshot of the last
accepted node. SGLang 0.5.23 implements exactly that for EAGLE trees (``topk > 1``): the causal
conv kernel derives ``retrieve_parent_token`` from ``retrieve_next_token`` /
``retrieve_next_sibling`` and every recurrent verify kernel that takes it starts node ``i`` from its
parent's per-step snapshot (``intermediate_ssm[slot, parent]``, one per draft token and linear
layer; the conv window from the parent chain in ``intermediate_conv_window``);
``spec_utils.commit_mamba_states_after_verify`` commits the snapshot of the tree step of the last
accepted node (``accept_index``). Whether a layout gets DDTREE's tree verify is whether its
SGLang kernels have that parent-pointer path: ``LAYOUTS``.

**Memory**: the per-node snapshots are SGLang's speculative state pool, sized
``(max_running_requests + 1) x window x mamba_cache_per_req`` (``kv_cache_configurator.
_handle_max_mamba_cache``; ``window`` is ``speculative_num_draft_tokens``, which DDTREE declares as
its widest verify window). ``tree_state_bytes`` computes it from a config's recurrent state shapes;
``check_tree_state_memory`` refuses a budget whose snapshots exceed a given figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from .settings import FLAG_ALLOW_HYBRID, MAX_BUDGET, DDTreeConfigError, ResolvedDDTree, format_budget

__all__ = [
    "TREE",
    "REFUSED",
    "NOT_PROVEN_ON_GPU",
    "NOTHING_TO_PROVE",
    "HybridLayout",
    "HybridVerdict",
    "LAYOUTS",
    "CONFIG_LAYOUTS",
    "layout_table",
    "TREE_VERIFY_REQUIREMENTS",
    "classify_hybrid",
    "RecurrentStateShapes",
    "gdn_state_shapes",
    "mamba2_state_shapes",
    "TreeStateEstimate",
    "tree_state_bytes",
    "check_tree_state_memory",
    "state_shapes_of",
    "TREE_STATE_SHARE",
    "HybridPlan",
    "hybrid_plan",
]

TREE = "tree"  # DDTREE verifies the tree: SGLang's kernels give each node its parent's state
REFUSED = "refused"

NOTHING_TO_PROVE = "nothing: refused"

#: What is proven, kept apart from what is implemented: nothing of it has run on a GPU.
NOT_PROVEN_ON_GPU = (
    "on the CPU reference only (reference/hybrid.py: per-node logits equal sequential decoding along "
    "each path, greedy and sampled output exact); never run on a GPU"
)


@dataclass(frozen=True)
class HybridLayout:
    """One family of SGLang 0.5.23 hybrid targets, by its linear-attention backend."""

    name: str
    backend: str  # SGLang's linear-attention backend class
    config_classes: tuple[str, ...]
    status: str  # TREE or REFUSED
    reason: str  # why refused; for TREE, how SGLang gives each node its parent's state
    source: str  # where in SGLang 0.5.23 this was read
    proven: str  # what has been shown, apart from what is implemented


_GDN = HybridLayout(
    name="GDN",
    backend="GDNAttnBackend",
    config_classes=(
        "Qwen3NextConfig",
        "Qwen3_5Config",
        "Qwen3_5TextConfig",
        "Qwen3_5MoeConfig",
        "Qwen3_5MoeTextConfig",
        "InternS2PreviewConfig",
        "JetNemotronConfig",
        "JetVLMConfig",
        "GigaChat35Config",  # the linear-attn registry's model: GDNAttnBackend
    ),
    status=TREE,
    reason=(
        "causal_conv1d_update derives retrieve_parent_token from the tree links and the Triton "
        "recurrent verify (fused_sigmoid_gating_delta_rule_update, HAS_EAGLE_TREE_CUSTOM_ATTN_MASK) "
        "starts each node from its parent's intermediate_ssm snapshot; a tree verify runs the Triton "
        "tree kernel even where linear verify is FlashInfer (GDNKernelDispatcher._get_target_verify_kernel)"
    ),
    source="layers/attention/linear/gdn_backend.py, linear/kernels/gdn_triton.py, "
    "kernels/ops/attention/linear/fused_sigmoid_gating_recurrent.py, kernels/ops/mamba/causal_conv1d_triton.py",
    proven=NOT_PROVEN_ON_GPU,
)

_MAMBA2 = HybridLayout(
    name="Mamba2",
    backend="Mamba2AttnBackend",
    config_classes=(
        "NemotronHConfig",
        "NemotronH_Nano_VL_V2_Config",
        "FalconH1Config",
        "GraniteMoeHybridConfig",
        "Mamba2Config",
        "MambaConfig",
        "FalconMambaConfig",
    ),
    status=TREE,
    reason=(
        "MambaMixer2's verify runs causal_conv1d_update with the tree links and selective_state_update "
        "with retrieve_parent_token, starting each node from its parent's intermediate_ssm snapshot"
    ),
    source="layers/attention/mamba/mamba.py, kernels/ops/mamba/triton_ops/mamba_ssm.py, "
    "kernels/ops/mamba/causal_conv1d_triton.py",
    proven=NOT_PROVEN_ON_GPU,
)

_KDA = HybridLayout(
    name="KDA",
    backend="KDAAttnBackend",
    config_classes=("KimiLinearConfig", "BailingHybridConfig", "Glm5NextConfig", "Glm5NextTextConfig"),
    status=TREE,
    reason=(
        "the Triton (and Helion) KDA verify kernels take retrieve_parent_token (the fused chain and the "
        "DSpARK CuTe verify step aside for it); with --linear-attn-verify-backend flashinfer SGLang "
        "itself refuses topk > 1 (recurrent_kda is chain-only)"
    ),
    source="layers/attention/linear/kda_backend.py, linear/kernels/kda_triton.py, kda_helion.py, kda_flashinfer.py",
    proven=NOT_PROVEN_ON_GPU,
)

_LIGHTNING = HybridLayout(
    name="Lightning",
    backend="LightningAttentionBackend",
    config_classes=("BailingHybridConfig", "MiniCPMHybridConfig"),
    status=REFUSED,
    reason=(
        "SGLang's Lightning (seg_la) backend verifies a draft tree as a chain and raises "
        "NotImplementedError for speculative decoding with topk > 1; no parent-pointer path"
    ),
    source="layers/attention/linear/lightning_backend.py (LightningAttentionBackend.__init__)",
    proven=NOTHING_TO_PROVE,
)

_SHORT_CONV = HybridLayout(
    name="ShortConv",
    backend="ShortConvAttnBackend",
    config_classes=("Lfm2Config", "Lfm2MoeConfig", "Lfm2VlConfig", "ZayaConfig"),
    status=REFUSED,
    reason=(
        "the short-conv verify (models/lfm2.py shortconv_target_verify, ZAYA1's CCA conv) runs "
        "causal_conv1d_update over the window as a chain, without the tree links; a sibling would "
        "continue from its predecessor's conv window"
    ),
    source="layers/attention/linear/short_conv_backend.py, models/lfm2.py",
    proven=NOTHING_TO_PROVE,
)

_INKLING = HybridLayout(
    name="Inkling",
    backend="Mamba2AttnBackend + InklingSConvBackend",
    config_classes=("InklingModelConfig", "InklingMMConfig"),
    status=REFUSED,
    reason=(
        "its attention short-conv sidecar (inkling_sconv_backend.py) keeps per-step conv windows for a "
        "chain only (no retrieve_parent_token anywhere in it)"
    ),
    source="layers/attention/linear/inkling_sconv_backend.py, models/inkling_common/attn.py",
    proven=NOTHING_TO_PROVE,
)

#: Every hybrid layout of SGLang 0.5.23 (``configs/hybrid_arch.py``: ``mamba2_config``,
#: ``hybrid_gdn_config``, ``hybrid_kda_config``, ``hybrid_lightning_config``, and the linear-attn
#: registry's ``GigaChat35Config``).
LAYOUTS: tuple[HybridLayout, ...] = (_GDN, _MAMBA2, _KDA, _LIGHTNING, _SHORT_CONV, _INKLING)

#: Config class name -> layout (``BailingHybridConfig`` is KDA or Lightning by ``use_kda``).
CONFIG_LAYOUTS: dict[str, HybridLayout] = {
    name: layout for layout in LAYOUTS if layout is not _LIGHTNING for name in layout.config_classes
}
CONFIG_LAYOUTS["MiniCPMHybridConfig"] = _LIGHTNING


def layout_table() -> list[dict[str, Any]]:
    """Every hybrid layout as the deploy tooling reports it (spec_verify): its name, SGLang's backend, the
    config classes it covers, whether DDTREE verifies a tree on it or refuses it and why, and what is
    proven. Plain values only (JSON)."""
    return [
        {
            "name": layout.name,
            "backend": layout.backend,
            "config_classes": sorted(name for name, of in CONFIG_LAYOUTS.items() if of is layout),
            "status": layout.status,
            "reason": layout.reason,
            "proven": layout.proven,
        }
        for layout in LAYOUTS
    ]


#: What the worker must arrange for a TREE layout (SGLang 0.5.23 builds the parent-pointer path
#: only for EAGLE trees; DFLASH, which DDTREE resolves as, has topk 1).
TREE_VERIFY_REQUIREMENTS = (
    "the linear-attention backend must see topk > 1 (MambaAttnBackendBase.topk, read from "
    "speculative_eagle_topk at construction): only then does it build retrieve_parent_token and copy "
    "the tree links into its CUDA-graph buffers; with DFLASH's topk 1 the window is verified as a chain",
    "the verify input carries retrieve_next_token / retrieve_next_sibling [bs, window] "
    "(core.verify.eagle_verify_links)",
    "the speculative conv-window cache must be dense: MambaPool deduplicates it into an overlapping "
    "sliding view when speculative_eagle_topk <= 1 (conv_window_dedup_enabled), which a tree's "
    "ancestor windows would corrupt",
    "the commit goes through spec_utils.commit_mamba_states_after_verify(target_worker, batch, "
    "accept_lens, accept_index, window): the tree step of the last accepted node (and the radix "
    "track step through accept_index), not DFLASH's _update_target_mamba_state_after_verify "
    "(commit_lens - 1, a chain)",
    "--enable-linear-replayssm-spec is refused (its ring verify is chain-only)",
)


@dataclass(frozen=True)
class HybridVerdict:
    """``classify_hybrid``'s answer: ``status`` TREE or REFUSED, the layout, the reason, a message."""

    config_class: str
    layout: Optional[str]
    status: str
    reason: str
    proven: str
    message: str

    @property
    def refused(self) -> bool:
        return self.status != TREE


def _verdict(name: str, layout: Optional[HybridLayout], status: str, reason: str) -> HybridVerdict:
    label = layout.name if layout is not None else "unknown layout"
    proven = layout.proven if layout is not None and status == TREE else NOTHING_TO_PROVE
    if status == TREE:
        message = (
            f"DDTREE verifies the hybrid target {name} ({label}) as a tree, each node's recurrent state "
            f"from its parent's: {reason}. Proven {proven}."
        )
    else:
        message = f"DDTREE refuses the hybrid target {name} ({label}): {reason}."
    return HybridVerdict(name, layout.name if layout is not None else None, status, reason, proven, message)


def classify_hybrid(
    config_class: str,
    *,
    use_kda: Optional[bool] = None,
    linear_attn_verify_backend: Optional[str] = None,
    replayssm_spec: bool = False,
) -> HybridVerdict:
    """Classify the config SGLang's ``mambaish_config`` returned, by its class name.

    Args:
        config_class: ``type(mambaish_config(model_config)).__name__`` (for GDN that is the text
            config, e.g. ``Qwen3_5TextConfig``).
        use_kda: ``BailingHybridConfig.use_kda`` (KDA when true, Lightning when false).
        linear_attn_verify_backend: the resolved ``--linear-attn-verify-backend`` (KDA: flashinfer
            is chain-only).
        replayssm_spec: ``--enable-linear-replayssm-spec`` (its ring verify is chain-only).
    """
    name = str(config_class)
    if name == "BailingHybridConfig":
        if use_kda is None:
            return _verdict(name, None, REFUSED, "BailingHybridConfig is KDA or Lightning by use_kda, not given")
        layout: Optional[HybridLayout] = _KDA if use_kda else _LIGHTNING
    else:
        layout = CONFIG_LAYOUTS.get(name)
    if layout is None:
        return _verdict(
            name,
            None,
            REFUSED,
            "not in DDTREE's table of SGLang 0.5.23 hybrid layouts (adapter/hybrid.py LAYOUTS), so whether "
            "its kernels give each tree node its parent's state is unknown",
        )
    if layout.status != TREE:
        return _verdict(name, layout, REFUSED, layout.reason)
    if replayssm_spec:
        return _verdict(
            name,
            layout,
            REFUSED,
            "--enable-linear-replayssm-spec verifies through a ring that is chain-only (SGLang asserts "
            "retrieve_parent_token is None there)",
        )
    backend = str(linear_attn_verify_backend or "").lower()
    if layout is _KDA and backend == "flashinfer":
        return _verdict(
            name,
            layout,
            REFUSED,
            "--linear-attn-verify-backend flashinfer: SGLang's KDA FlashInfer verify (recurrent_kda) is "
            "chain-only and SGLang refuses topk > 1 with it; use triton or helion",
        )
    return _verdict(name, layout, TREE, layout.reason)


@dataclass(frozen=True)
class HybridPlan:
    """What a DDTREE server does with a hybrid target (``hybrid_plan``).

    ``refusal``: the message the worker refuses to start with, or None; ``tree_state``: whether the worker
    arranges SGLang's parent-pointer verify (``TREE_VERIFY_REQUIREMENTS``); ``warning``: a message to log
    at start, or None."""

    refusal: Optional[str]
    tree_state: bool
    warning: Optional[str]


def hybrid_plan(verdict: Optional[HybridVerdict], allow_unsafe: bool) -> Optional[HybridPlan]:
    """The decision for a target ``classify_hybrid`` judged (None: not a hybrid, nothing to do).

    * A refused layout: refused; with ``allow_unsafe`` it runs as a chain-state verify, warned lossy.
    * A TREE layout: the worker verifies each node from its parent's state. Until that is proven on a GPU
      (``HybridLayout.proven``) it needs ``allow_unsafe`` too, and runs warned "not proven"; once proven it
      runs without the flag.
    """
    if verdict is None:
        return None
    if verdict.refused:
        if not allow_unsafe:
            return HybridPlan(
                f"{verdict.message} ({FLAG_ALLOW_HYBRID} overrides; outputs may then be lossy)", False, None
            )
        return HybridPlan(
            None, False, f"{verdict.message} Running it anyway ({FLAG_ALLOW_HYBRID}): outputs may be lossy."
        )
    if verdict.proven != NOT_PROVEN_ON_GPU:
        return HybridPlan(None, True, None)
    unproven = (
        f"DDTREE verifies the hybrid target {verdict.config_class} ({verdict.layout}) as a tree, each node's "
        f"recurrent state from its parent's (SGLang's tree path for linear attention); this is proven {verdict.proven}"
    )
    if not allow_unsafe:
        return HybridPlan(f"{unproven}. {FLAG_ALLOW_HYBRID} runs it.", True, None)
    return HybridPlan(None, True, f"{unproven}. Running it ({FLAG_ALLOW_HYBRID}).")


# ---- state memory ------------------------------------------------------------------------------


@dataclass(frozen=True)
class RecurrentStateShapes:
    """One request's recurrent state per linear layer, as SGLang's ``BaseLinearStateParams``.

    ``conv``: the conv-state shapes of a layer (elements of ``conv_dtype_bytes``); ``temporal``: the
    SSM state shape (elements of ``ssm_dtype_bytes``); ``num_layers``: the linear layers (on one
    pipeline stage). Shapes are per GPU (already divided by the attention TP size).
    """

    conv: tuple[tuple[int, ...], ...]
    temporal: tuple[int, ...]
    num_layers: int
    conv_dtype_bytes: int = 2  # SGLANG_MAMBA_CONV_DTYPE, bfloat16 by default
    ssm_dtype_bytes: int = 4  # mamba_ssm_dtype / SGLANG_MAMBA_SSM_DTYPE, float32 by default

    @property
    def layer_bytes(self) -> int:
        conv = sum(_prod(shape) for shape in self.conv) * self.conv_dtype_bytes
        return conv + _prod(self.temporal) * self.ssm_dtype_bytes

    @property
    def per_request_bytes(self) -> int:
        """SGLang's ``mamba_cache_per_req``: one request's state over every linear layer."""
        return self.layer_bytes * self.num_layers


def _prod(shape: Sequence[int]) -> int:
    out = 1
    for d in shape:
        out *= int(d)
    return out


def _divide(a: int, b: int) -> int:
    if a % b:
        raise ValueError(f"{a} is not divisible by the TP size {b}")
    return a // b


def _text_config(hf_config: Mapping[str, Any]) -> Mapping[str, Any]:
    sub = hf_config.get("text_config")
    return sub if isinstance(sub, Mapping) and "linear_num_value_heads" in sub else hf_config


def _dtype_bytes(name: Any, default: int) -> int:
    return {"float32": 4, "bfloat16": 2, "float16": 2}.get(str(name), default) if name is not None else default


def _mamba2_shape(tp: int, intermediate: int, n_groups: int, heads: int, head_dim: int, state: int, kernel: int):
    # Mamba2StateShape.create: groups replicated to the TP size when they do not divide.
    if n_groups % tp:
        n_groups += tp - n_groups
    conv_dim = intermediate + 2 * n_groups * state
    return ((_divide(conv_dim, tp), kernel - 1),), (_divide(heads, tp), head_dim, state)


def gdn_state_shapes(
    hf_config: Mapping[str, Any],
    tp_size: int = 1,
    conv_dtype_bytes: int = 2,
    ssm_dtype_bytes: Optional[int] = None,
) -> RecurrentStateShapes:
    """A GDN target's state shapes from its ``config.json`` (``text_config`` when the fields are there).

    As SGLang's ``Qwen3NextConfig.mamba2_cache_params``: conv ``(value_dim + 2 * key_heads *
    key_dim) / tp x (kernel - 1)``, temporal ``(value_heads / tp, value_dim, key_dim)``; linear layers
    from ``layer_types`` (``linear_attention``), else every layer but each ``full_attention_interval``-th.
    The SSM dtype is ``mamba_ssm_dtype`` (float32 when absent) unless ``ssm_dtype_bytes`` is given.
    """
    cfg = _text_config(hf_config)
    key_dim, value_dim = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"])
    key_heads, value_heads = int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"])
    conv, temporal = _mamba2_shape(
        tp_size, value_dim * value_heads, key_heads, value_heads, value_dim, key_dim, int(cfg["linear_conv_kernel_dim"])
    )
    kinds = cfg.get("layer_types")
    if isinstance(kinds, (list, tuple)) and kinds:
        layers = sum(1 for k in kinds if str(k) == "linear_attention")
    else:
        interval = int(cfg.get("full_attention_interval", 4))
        layers = sum(1 for i in range(int(cfg["num_hidden_layers"])) if (i + 1) % interval)
    ssm = ssm_dtype_bytes if ssm_dtype_bytes is not None else _dtype_bytes(cfg.get("mamba_ssm_dtype"), 4)
    return RecurrentStateShapes(conv, temporal, layers, conv_dtype_bytes, ssm)


def mamba2_state_shapes(
    hf_config: Mapping[str, Any],
    tp_size: int = 1,
    conv_dtype_bytes: int = 2,
    ssm_dtype_bytes: Optional[int] = None,
) -> RecurrentStateShapes:
    """A Nemotron-H style Mamba2 target's state shapes (``mamba_num_heads``, ``mamba_head_dim``,
    ``n_groups``, ``ssm_state_size``, ``conv_kernel``; Mamba layers = ``M`` in
    ``hybrid_override_pattern``), as SGLang's ``NemotronHConfig.mamba2_cache_params``."""
    cfg = hf_config
    heads, head_dim = int(cfg["mamba_num_heads"]), int(cfg["mamba_head_dim"])
    conv, temporal = _mamba2_shape(
        tp_size,
        heads * head_dim,
        int(cfg["n_groups"]),
        heads,
        head_dim,
        int(cfg["ssm_state_size"]),
        int(cfg["conv_kernel"]),
    )
    layers = str(cfg.get("hybrid_override_pattern", "")).count("M")
    ssm = ssm_dtype_bytes if ssm_dtype_bytes is not None else _dtype_bytes(cfg.get("mamba_ssm_dtype"), 4)
    return RecurrentStateShapes(conv, temporal, layers, conv_dtype_bytes, ssm)


def state_shapes_of(hf_config: Mapping[str, Any], tp_size: int = 1) -> Optional[RecurrentStateShapes]:
    """The recurrent state shapes of a hybrid ``config.json`` whose layout has a tree path: GDN
    (``linear_key_head_dim``) or Mamba2 (``mamba_num_heads``); None for any other."""
    if "linear_key_head_dim" in _text_config(hf_config):
        return gdn_state_shapes(hf_config, tp_size)
    if "mamba_num_heads" in hf_config and "hybrid_override_pattern" in hf_config:
        return mamba2_state_shapes(hf_config, tp_size)
    return None


#: The share of SGLang's static memory (``mem_fraction_static`` x the GPU) the tree's state snapshots may
#: take: the static pool also holds the weights and the KV cache, so snapshots past a quarter of it leave
#: a server too few KV tokens to batch.
TREE_STATE_SHARE = 0.25


@dataclass(frozen=True)
class TreeStateEstimate:
    """The per-node state snapshots of a tree verify, for one window.

    ``snapshots_per_request``: one per tree node (the window's ``budget + 1`` slots) per linear layer;
    ``bytes_per_request``: their size; ``total_bytes``: for ``request_slots`` (max running requests +
    SGLang's padding slot), SGLang's ``intermediate_ssm`` + dense ``intermediate_conv_window``;
    ``block_bytes``: the same at the drafter's block (what DFLASH reserves anyway); ``extra_bytes``:
    ``total_bytes - block_bytes``.
    """

    window: int
    request_slots: int
    snapshots_per_request: int
    bytes_per_request: int
    total_bytes: int
    block_bytes: int

    @property
    def extra_bytes(self) -> int:
        return self.total_bytes - self.block_bytes


def tree_state_bytes(
    shapes: RecurrentStateShapes, window: int, max_running_requests: int, block: Optional[int] = None
) -> TreeStateEstimate:
    """Snapshot memory of a tree verify of ``window`` tokens (budget + 1) for ``max_running_requests``."""
    window, slots = int(window), int(max_running_requests) + 1
    per_request = window * shapes.per_request_bytes
    block_window = min(window, int(block)) if block is not None else window
    return TreeStateEstimate(
        window=window,
        request_slots=slots,
        snapshots_per_request=window * shapes.num_layers,
        bytes_per_request=per_request,
        total_bytes=slots * per_request,
        block_bytes=slots * block_window * shapes.per_request_bytes,
    )


def check_tree_state_memory(
    shapes: RecurrentStateShapes,
    resolved: ResolvedDDTree,
    source: str,
    max_running_requests: int,
    limit_bytes: int,
) -> TreeStateEstimate:
    """Refuse a budget whose tree-verify state snapshots exceed ``limit_bytes``; return the estimate.

    SGLang sizes the snapshot pool once, by the widest verify window (``speculative_num_draft_tokens``)
    for every request slot, so a budget schedule does not shrink it: the widest budget counts. The
    error names the flag or variable, the budget, the bytes, the limit and the largest budget that
    fits (0: not even the drafter's block).
    """
    need = tree_state_bytes(shapes, resolved.window, max_running_requests, resolved.block)
    if need.total_bytes <= limit_bytes:
        return need
    fits = 0
    for budget in range(1, MAX_BUDGET + 1):
        window = max(budget + 1, resolved.block)
        if tree_state_bytes(shapes, window, max_running_requests).total_bytes > limit_bytes:
            break
        fits = budget
    gib, mib = 1 << 30, 1 << 20
    raise DDTreeConfigError(
        f"{source} {format_budget(resolved.schedule or resolved.budget)} needs a verify window of "
        f"{resolved.window} tokens; on this hybrid target its tree verify keeps a recurrent state "
        f"snapshot per tree node and linear layer ({need.snapshots_per_request} per request, "
        f"{need.bytes_per_request / mib:.1f} MiB); for {max_running_requests} requests (+1 padding slot) "
        f"they take {need.total_bytes / gib:.1f} GiB, over the {limit_bytes / gib:.1f} GiB allowed for them. "
        f"The largest single budget that fits is {fits}; lower {source} (the snapshots are sized by the "
        "widest window for every request, so a schedule does not help) or lower --max-running-requests."
    )
