"""DDTree settings: flags, environment variables, defaults and their validation.

Pure Python: imports neither torch nor sglang, so the lab runtime, the deploy tooling and the
tests can use it anywhere.

Precedence, per setting: command-line flag > environment variable > default. A bad value is an
error that names the flag or the variable it came from, and the value.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Mapping, Optional

# ---- names -------------------------------------------------------------------------------

FLAG_BUDGET = "--speculative-ddtree-budget"
FLAG_TOP_K = "--speculative-ddtree-top-k"
FLAG_ALLOW_HYBRID = "--speculative-ddtree-allow-hybrid-unsafe"

# argparse destinations of the flags above.
DEST_BUDGET = "speculative_ddtree_budget"
DEST_TOP_K = "speculative_ddtree_top_k"
DEST_ALLOW_HYBRID = "speculative_ddtree_allow_hybrid_unsafe"

ENV_BUDGET = "SGLANG_DDTREE_BUDGET"
ENV_TOP_K = "SGLANG_DDTREE_TOP_K"
ENV_ALLOW_HYBRID = "SGLANG_DDTREE_ALLOW_HYBRID_UNSAFE"

ALGORITHM_NAME = "DDTREE"

# ---- defaults ----------------------------------------------------------------------------

# Budget: None means "the whole DFlash verify window": window - 1 nodes besides the root
# (15 for the usual DFlash block size 16). DDTree then verifies exactly as many tokens per
# request as DFlash does, so every buffer, KV reservation and graph shape stays DFlash's.
DEFAULT_BUDGET: Optional[int] = None
# Per-position candidates kept from the drafter. A best-first tree of B nodes never uses a
# rank >= B, and ranks past 8 almost never win at the default budget.
DEFAULT_TOP_K = 8
DEFAULT_ALLOW_HYBRID_UNSAFE = False

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off"})


class DDTreeConfigError(ValueError):
    """A DDTree setting is invalid. The message names the flag or variable and the value."""


@dataclass(frozen=True)
class DDTreeSettings:
    """DDTree settings as asked for (before the verify window is known).

    ``budget`` None means "fill the verify window". ``*_source`` says where each value came from:
    the flag, the environment variable, or ``"default"``.
    """

    budget: Optional[int] = DEFAULT_BUDGET
    top_k: int = DEFAULT_TOP_K
    allow_hybrid_unsafe: bool = DEFAULT_ALLOW_HYBRID_UNSAFE
    budget_source: str = "default"
    top_k_source: str = "default"
    allow_hybrid_unsafe_source: str = "default"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DDTreeSettings":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


@dataclass(frozen=True)
class ResolvedDDTree:
    """DDTree settings once the DFlash verify window (``speculative_num_draft_tokens``) is known.

    ``verify_width`` = ``budget`` + 1 (the root) <= ``window``; the verify forward carries
    ``window`` tokens per request, the tail past ``verify_width`` being inert padding.
    """

    budget: int
    top_k: int
    allow_hybrid_unsafe: bool
    window: int

    @property
    def verify_width(self) -> int:
        return self.budget + 1

    @property
    def effective_top_k(self) -> int:
        return min(self.top_k, self.budget)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ResolvedDDTree":
        return cls(**{k: data[k] for k in cls.__dataclass_fields__})


# ---- value parsing -------------------------------------------------------------------------


def parse_positive_int(raw: Any, name: str) -> int:
    """Parse an integer >= 1; ``name`` (a flag or variable) goes into the error."""
    if isinstance(raw, bool):
        raise DDTreeConfigError(f"{name} must be an integer >= 1, got {raw!r}")
    if isinstance(raw, int):
        value = raw
    else:
        text = str(raw).strip()
        try:
            value = int(text, 10)
        except ValueError:
            raise DDTreeConfigError(f"{name} must be an integer >= 1, got {raw!r}") from None
    if value < 1:
        raise DDTreeConfigError(f"{name} must be an integer >= 1, got {raw!r}")
    return value


def parse_bool(raw: Any, name: str) -> bool:
    """Parse 1/0, true/false, yes/no, on/off (any case); ``name`` goes into the error."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise DDTreeConfigError(
        f"{name} must be one of 1/0, true/false, yes/no, on/off, got {raw!r}"
    )


def _env_value(environ: Mapping[str, str], name: str) -> Optional[str]:
    value = environ.get(name)
    if value is None or value.strip() == "":
        return None  # unset and empty mean the same (systemd's Environment=NAME=)
    return value


def resolve_settings(
    flags: Optional[Mapping[str, Any]] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> DDTreeSettings:
    """Merge flags (argparse dests -> value, None = not given), environment and defaults."""
    flags = dict(flags or {})
    environ = os.environ if environ is None else environ

    budget, budget_source = DEFAULT_BUDGET, "default"
    if flags.get(DEST_BUDGET) is not None:
        budget, budget_source = parse_positive_int(flags[DEST_BUDGET], FLAG_BUDGET), FLAG_BUDGET
    elif (raw := _env_value(environ, ENV_BUDGET)) is not None:
        budget, budget_source = parse_positive_int(raw, ENV_BUDGET), ENV_BUDGET

    top_k, top_k_source = DEFAULT_TOP_K, "default"
    if flags.get(DEST_TOP_K) is not None:
        top_k, top_k_source = parse_positive_int(flags[DEST_TOP_K], FLAG_TOP_K), FLAG_TOP_K
    elif (raw := _env_value(environ, ENV_TOP_K)) is not None:
        top_k, top_k_source = parse_positive_int(raw, ENV_TOP_K), ENV_TOP_K

    allow, allow_source = DEFAULT_ALLOW_HYBRID_UNSAFE, "default"
    if flags.get(DEST_ALLOW_HYBRID) is not None:
        allow, allow_source = parse_bool(flags[DEST_ALLOW_HYBRID], FLAG_ALLOW_HYBRID), FLAG_ALLOW_HYBRID
    elif (raw := _env_value(environ, ENV_ALLOW_HYBRID)) is not None:
        allow, allow_source = parse_bool(raw, ENV_ALLOW_HYBRID), ENV_ALLOW_HYBRID

    return DDTreeSettings(
        budget=budget,
        top_k=top_k,
        allow_hybrid_unsafe=allow,
        budget_source=budget_source,
        top_k_source=top_k_source,
        allow_hybrid_unsafe_source=allow_source,
    )


def resolve_for_window(settings: DDTreeSettings, window: Optional[int]) -> ResolvedDDTree:
    """Fix the budget against the DFlash verify window (``speculative_num_draft_tokens``).

    The tree (root + budget nodes) must fit the window DFlash reserves and verifies per request.
    """
    if window is None or int(window) < 2:
        raise DDTreeConfigError(
            "DDTREE needs a DFlash verify window (--speculative-num-draft-tokens, i.e. the "
            f"DFlash block size) of at least 2 tokens, got {window!r}"
        )
    window = int(window)
    budget = window - 1 if settings.budget is None else int(settings.budget)
    if budget > window - 1:
        source = settings.budget_source
        raise DDTreeConfigError(
            f"{source} {budget} does not fit the DFlash verify window of {window} tokens "
            f"(--speculative-num-draft-tokens / --speculative-dflash-block-size): the tree holds "
            f"the root plus at most {window - 1} nodes. Lower {source} to <= {window - 1}, or widen "
            "the window (which also widens the DFlash drafter's block)."
        )
    return ResolvedDDTree(
        budget=budget,
        top_k=int(settings.top_k),
        allow_hybrid_unsafe=bool(settings.allow_hybrid_unsafe),
        window=window,
    )


# ---- hybrid / linear-attention targets -------------------------------------------------------

# model_type values of hybrid (Mamba / linear-attention / SSM) architectures SGLang 0.5.23 serves
# (sglang/srt/configs/hybrid_arch.py and the model registry). A recurrent state cannot branch,
# so a tree verify over such a target is not supported unless explicitly allowed.
HYBRID_MODEL_TYPES = frozenset(
    {
        "bailing_hybrid",
        "bamba",
        "falcon_h1",
        "falcon_mamba",
        "glm5_next",
        "granitemoehybrid",
        "inkling",
        "jamba",
        "jet_nemotron",
        "jet_vlm",
        "kimi_linear",
        "lfm2",
        "lfm2_moe",
        "lfm2_vl",
        "mamba",
        "mamba2",
        "minicpm_hybrid",
        "nemotron_h",
        "plamo2",
        "qwen3_5",
        "qwen3_5_moe",
        "qwen3_next",
        "zamba",
        "zamba2",
        "zaya",
    }
)
_HYBRID_LAYER_KINDS = frozenset(
    {"mamba", "mamba2", "linear_attention", "linear", "gated_delta", "gdn", "ssm", "kda", "lightning"}
)


def hybrid_target_reason(hf_config: Mapping[str, Any]) -> Optional[str]:
    """Why an HF ``config.json`` (as a dict) describes a hybrid/recurrent target, or None.

    Looks at ``model_type`` (also of ``text_config``/``llm_config``), ``layer_types`` /
    ``layers_block_type`` entries and a Nemotron-H style ``hybrid_override_pattern``.
    """
    configs = [("config", hf_config)]
    for key in ("text_config", "llm_config"):
        sub = hf_config.get(key)
        if isinstance(sub, Mapping):
            configs.append((key, sub))
    for where, cfg in configs:
        model_type = str(cfg.get("model_type") or "").lower()
        if model_type in HYBRID_MODEL_TYPES:
            return f"{where}.model_type {model_type!r} is a hybrid (Mamba/linear-attention) architecture"
        for key in ("layer_types", "layers_block_type"):
            kinds = cfg.get(key)
            if isinstance(kinds, (list, tuple)):
                found = sorted({str(k).lower() for k in kinds} & _HYBRID_LAYER_KINDS)
                if found:
                    return f"{where}.{key} contains recurrent layers {found}"
        pattern = cfg.get("hybrid_override_pattern")
        if isinstance(pattern, str) and "M" in pattern:
            return f"{where}.hybrid_override_pattern {pattern!r} has Mamba layers"
    return None


def read_local_hf_config(model_path: Optional[str]) -> Optional[dict]:
    """``config.json`` of a local model directory, or None (hub ids and unreadable files)."""
    if not model_path:
        return None
    path = Path(model_path) / "config.json"
    try:
        with path.open("r", encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_hybrid_target(
    model_path: Optional[str],
    settings: DDTreeSettings,
    hf_config: Optional[Mapping[str, Any]] = None,
) -> Optional[str]:
    """Refuse a hybrid target unless allowed. Returns the reason when allowed (to log), else None.

    Raises DDTreeConfigError naming the model and the flag/variable that would allow it.
    """
    cfg = hf_config if hf_config is not None else read_local_hf_config(model_path)
    if cfg is None:
        return None
    reason = hybrid_target_reason(cfg)
    if reason is None:
        return None
    if settings.allow_hybrid_unsafe:
        return reason
    raise DDTreeConfigError(
        f"DDTREE refuses the hybrid target {model_path!r}: {reason}. A tree verify cannot branch "
        f"a recurrent state; set {FLAG_ALLOW_HYBRID} (or {ENV_ALLOW_HYBRID}=1) to run it anyway "
        "(unsupported, untested)."
    )
