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
from typing import Any, Mapping, Optional, Sequence


def _load_knobs():
    """``sglang_overlay.knobs``: from the package, or by path beside it when this module is loaded on its own
    (the deploy tooling's tests load it by path, without the package); knobs.py imports nothing of ours."""
    try:
        from .. import knobs

        return knobs
    except ImportError:
        import importlib.util
        import sys

        path = Path(__file__).resolve().parents[1] / "knobs.py"
        spec = importlib.util.spec_from_file_location("sglang_overlay_knobs_by_path", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module


_knobs = _load_knobs()

# ---- names -------------------------------------------------------------------------------

FLAG_BUDGET = "--speculative-ddtree-budget"
FLAG_TOP_K = "--speculative-ddtree-top-k"
FLAG_ALLOW_HYBRID = "--speculative-ddtree-allow-hybrid-unsafe"

# argparse destinations of the flags above.
DEST_BUDGET = "speculative_ddtree_budget"
DEST_TOP_K = "speculative_ddtree_top_k"
DEST_ALLOW_HYBRID = "speculative_ddtree_allow_hybrid_unsafe"

# The variables are declared once, in knobs.py (``FlagFallback``); their names here are the knobs'.
ENV_BUDGET = _knobs.BUDGET.name
ENV_TOP_K = _knobs.TOP_K.name
ENV_ALLOW_HYBRID = _knobs.ALLOW_HYBRID_UNSAFE.name

ALGORITHM_NAME = "DDTREE"

# ---- defaults ----------------------------------------------------------------------------

# Budget: None means "the drafter's block": block - 1 nodes besides the root (15 for the usual
# DFlash block size 16). DDTree then verifies exactly as many tokens per request as DFlash does.
# A budget is an int, or a schedule of budgets by batch size (``BudgetSchedule``).
DEFAULT_BUDGET: Optional[int] = None
#: The largest budget: the tree kernel keeps up to 512 frontier entries in registers
#: (``kernels.tree_build.MAX_BUDGET``) and the verify window is budget + 1.
MAX_BUDGET = 511
# Per-position candidates kept from the drafter when --speculative-ddtree-top-k is not given: a
# best-first tree of B nodes never uses a rank >= B, ranks past 8 almost never win within 16
# nodes, and a wider tree spreads over more ranks (``default_top_k``).
DEFAULT_TOP_K = 8
#: Largest top-k (``kernels.tree_build.MAX_TOP_K``).
MAX_TOP_K = 64
DEFAULT_ALLOW_HYBRID_UNSAFE = False

_TRUE = frozenset(_knobs.EnvBool.TRUE)
_FALSE = frozenset(_knobs.EnvBool.FALSE)


class DDTreeConfigError(ValueError):
    """A DDTree setting is invalid. The message names the flag or variable and the value."""


@dataclass(frozen=True)
class DDTreeSettings:
    """DDTree settings as asked for (before the verify window is known).

    ``budget`` None means "the drafter's block"; an int, or a schedule as
    ``((max_batch_size, budget), ...)`` (``parse_budget``). ``top_k`` None means ``default_top_k``
    of the budget. ``*_source`` says where each value came from: the flag, the environment
    variable, or ``"default"``.
    """

    budget: Any = DEFAULT_BUDGET
    top_k: Optional[int] = None
    allow_hybrid_unsafe: bool = DEFAULT_ALLOW_HYBRID_UNSAFE
    budget_source: str = "default"
    top_k_source: str = "default"
    allow_hybrid_unsafe_source: str = "default"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "DDTreeSettings":
        values = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        if isinstance(values.get("budget"), (list, tuple)):
            values["budget"] = _schedule_tuple(values["budget"])
        return cls(**values)


@dataclass(frozen=True)
class ResolvedDDTree:
    """DDTree settings once the drafter's block (DFlash's ``speculative_num_draft_tokens``) is known.

    ``window`` is the server's verify window: the tokens per request SGLang reserves KV for and
    captures its target verify graphs with. ``draft_block`` is the drafter's block (None: equal to
    ``window``); the tree's depth is at most ``draft_block - 1``. ``schedule`` (empty for one
    budget) holds ``(max_batch_size, budget)`` pairs by ascending batch size: a step of ``bs``
    requests takes the first entry whose ``max_batch_size >= bs`` (the last entry above them all)
    and verifies ``budget + 1`` tokens per request (``for_batch``).
    """

    budget: int
    top_k: int
    allow_hybrid_unsafe: bool
    window: int
    draft_block: Optional[int] = None
    schedule: tuple = ()

    @property
    def verify_width(self) -> int:
        return self.budget + 1

    @property
    def effective_top_k(self) -> int:
        return min(self.top_k, self.budget)

    @property
    def block(self) -> int:
        """The drafter's block (its draft positions are ``block - 1``)."""
        return self.window if self.draft_block is None else self.draft_block

    def for_batch(self, batch_size: int) -> "ResolvedDDTree":
        """The settings a step of ``batch_size`` requests runs with (itself without a schedule)."""
        if not self.schedule:
            return self
        budget = budget_for_batch(self.schedule, batch_size)
        return ResolvedDDTree(
            budget=budget,
            top_k=self.top_k,
            allow_hybrid_unsafe=self.allow_hybrid_unsafe,
            window=budget + 1,
            draft_block=self.block,
        )

    def window_batch_sizes(self, batch_sizes: Sequence[int]) -> dict[int, list[int]]:
        """Which of ``batch_sizes`` (e.g. the captured ones) each verify window serves."""
        out: dict[int, list[int]] = {}
        for bs in sorted({int(b) for b in batch_sizes if int(b) > 0}):
            out.setdefault(self.for_batch(bs).window, []).append(bs)
        return out

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ResolvedDDTree":
        values = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        values["schedule"] = _schedule_tuple(values.get("schedule") or ())
        return cls(**values)


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


def _schedule_tuple(pairs: Any) -> tuple:
    return tuple((int(bs), int(budget)) for bs, budget in pairs)


def _check_budget(value: int, name: str, raw: Any) -> int:
    if value > MAX_BUDGET:
        raise DDTreeConfigError(f"{name} must be at most {MAX_BUDGET} (the tree kernel's frontier), got {raw!r}")
    return value


def parse_budget(raw: Any, name: str) -> Any:
    """A budget: an integer in 1..MAX_BUDGET, or a schedule of budgets by batch size.

    A schedule is ``"1:127,4:63,16:15,48:7"`` (or a mapping / JSON object of the same pairs):
    batch sizes up to 1 take 127 nodes, 2-4 take 63, 5-16 take 15, 17 and more take 7. Returned as
    ``((1, 127), (4, 63), (16, 15), (48, 7))``, sorted by batch size. Errors name ``name`` and the value.
    """
    if isinstance(raw, (list, tuple)) and raw and isinstance(raw[0], (list, tuple)):
        pairs = list(raw)
    elif isinstance(raw, Mapping):
        pairs = list(raw.items())
    else:
        text = str(raw).strip()
        if text.startswith("{"):
            try:
                loaded = json.loads(text)
            except ValueError:
                raise DDTreeConfigError(
                    f"{name}: a schedule must be a JSON object or 'BS:BUDGET,...', got {raw!r}"
                ) from None
            return parse_budget(loaded, name)
        if ":" not in text:
            return _check_budget(parse_positive_int(raw, name), name, raw)
        pairs = []
        for item in text.split(","):
            bs, sep, budget = item.partition(":")
            if not sep:
                raise DDTreeConfigError(
                    f"{name}: schedule entry {item.strip()!r} is not BATCH_SIZE:BUDGET (e.g. '1:127,4:63,16:15')"
                )
            pairs.append((bs, budget))
    if not pairs:
        raise DDTreeConfigError(f"{name}: an empty schedule, got {raw!r}")
    schedule = {}
    for bs, budget in pairs:
        size = parse_positive_int(bs, f"{name} batch size")
        if size in schedule:
            raise DDTreeConfigError(f"{name}: batch size {size} appears twice in {raw!r}")
        schedule[size] = _check_budget(parse_positive_int(budget, f"{name} budget for batch size {size}"), name, raw)
    return tuple(sorted(schedule.items()))


def budget_for_batch(schedule: Sequence[tuple[int, int]], batch_size: int) -> int:
    """The budget a schedule gives a step of ``batch_size`` requests (see ``parse_budget``)."""
    for max_bs, budget in schedule:
        if batch_size <= max_bs:
            return int(budget)
    return int(schedule[-1][1])


def default_top_k(budget: int) -> int:
    """Top-k for a budget when none is given: 8 up to 64 nodes, then about budget / 8, at most 32.

    A node of rank r at some depth costs the tree r siblings before it; in a tree of ``budget``
    nodes over 15 positions the ranks that can still win grow with the budget.
    """
    return max(DEFAULT_TOP_K, min(32, (int(budget) + 7) // 8))


def parse_bool(raw: Any, name: str) -> bool:
    """Parse 1/0, true/false, yes/no, on/off (any case); ``name`` goes into the error."""
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise DDTreeConfigError(f"{name} must be one of 1/0, true/false, yes/no, on/off, got {raw!r}")


def resolve_settings(
    flags: Optional[Mapping[str, Any]] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> DDTreeSettings:
    """Merge flags (argparse dests -> value, None = not given), environment and defaults."""
    flags = dict(flags or {})
    environ = os.environ if environ is None else environ

    budget, budget_source = DEFAULT_BUDGET, "default"
    if flags.get(DEST_BUDGET) is not None:
        budget, budget_source = parse_budget(flags[DEST_BUDGET], FLAG_BUDGET), FLAG_BUDGET
    elif (raw := _knobs.BUDGET.raw(environ)) is not None:
        budget, budget_source = parse_budget(raw, ENV_BUDGET), ENV_BUDGET

    top_k, top_k_source = None, "default"
    if flags.get(DEST_TOP_K) is not None:
        top_k, top_k_source = parse_positive_int(flags[DEST_TOP_K], FLAG_TOP_K), FLAG_TOP_K
    elif (raw := _knobs.TOP_K.raw(environ)) is not None:
        top_k, top_k_source = parse_positive_int(raw, ENV_TOP_K), ENV_TOP_K
    if top_k is not None and top_k > MAX_TOP_K:
        raise DDTreeConfigError(f"{top_k_source} must be at most {MAX_TOP_K}, got {top_k}")

    allow, allow_source = DEFAULT_ALLOW_HYBRID_UNSAFE, "default"
    if flags.get(DEST_ALLOW_HYBRID) is not None:
        allow, allow_source = parse_bool(flags[DEST_ALLOW_HYBRID], FLAG_ALLOW_HYBRID), FLAG_ALLOW_HYBRID
    elif (raw := _knobs.ALLOW_HYBRID_UNSAFE.raw(environ)) is not None:
        allow, allow_source = parse_bool(raw, ENV_ALLOW_HYBRID), ENV_ALLOW_HYBRID

    return DDTreeSettings(
        budget=budget,
        top_k=top_k,
        allow_hybrid_unsafe=allow,
        budget_source=budget_source,
        top_k_source=top_k_source,
        allow_hybrid_unsafe_source=allow_source,
    )


def resolve_for_window(settings: DDTreeSettings, block: Optional[int]) -> ResolvedDDTree:
    """Fix the budget against the drafter's block (DFlash's ``speculative_num_draft_tokens``).

    The tree's depth is at most ``block - 1`` (one drafter position per level); its width is the
    budget. One budget verifies ``max(budget + 1, block)`` tokens per request (a budget below the
    block is padded to it, as DFlash verifies its whole block); a schedule verifies each entry's
    ``budget + 1``, and the server's window is the widest of them and the block.
    """
    if block is None or int(block) < 2:
        raise DDTreeConfigError(
            "DDTREE needs a DFlash drafter block (--speculative-num-draft-tokens, i.e. the "
            f"DFlash block size) of at least 2 tokens, got {block!r}"
        )
    block = int(block)
    budget = settings.budget
    if budget is None:
        budget = block - 1
    if isinstance(budget, tuple):
        schedule = _schedule_tuple(budget)
        first = schedule[0][1]
        window = max(block, max(b for _, b in schedule) + 1)
    else:
        schedule, first = (), int(budget)
        window = max(block, first + 1)
    widest = max([first] + [b for _, b in schedule])
    top_k = settings.top_k if settings.top_k is not None else default_top_k(widest)
    return ResolvedDDTree(
        budget=first,
        top_k=int(top_k),
        allow_hybrid_unsafe=bool(settings.allow_hybrid_unsafe),
        window=window,
        draft_block=block,
        schedule=schedule,
    )


def verify_buffer_bytes(window: int, batch_size: int, context_len: int, vocab_size: int) -> int:
    """GPU memory SGLang's target verify graphs of one window take outside the static KV fraction.

    Per verify token: the Triton backend's graph KV-index buffer (int64 over the context), its
    verify-mask buffer (a byte per prefix + window column) and a float32 logits row.
    """
    tokens = int(window) * int(batch_size)
    return tokens * (8 * int(context_len) + int(context_len) + int(window) + 4 * int(vocab_size))


def windows_with_batch_sizes(resolved: ResolvedDDTree, max_batch_size: int) -> dict[int, int]:
    """Each verify window the server captures graphs for, with the largest batch size it serves.

    The server's window (SGLang's own target graphs) serves every batch size; a schedule's other
    windows serve their entries' batch sizes only.
    """
    out = {resolved.window: int(max_batch_size)}
    for size in range(1, int(max_batch_size) + 1):
        window = resolved.for_batch(size).window
        if window != resolved.window:
            out[window] = max(out.get(window, 0), size)
    return out


def check_verify_memory(
    resolved: ResolvedDDTree,
    source: str,
    max_batch_size: int,
    context_len: int,
    vocab_size: int,
    limit_bytes: int,
) -> int:
    """Refuse windows whose verify graph buffers exceed ``limit_bytes``; return the bytes they take.

    The error names the flag or variable, the estimate, the limit and the largest budget that fits.
    """

    def total(res: ResolvedDDTree) -> int:
        return sum(
            verify_buffer_bytes(w, bs, context_len, vocab_size)
            for w, bs in windows_with_batch_sizes(res, max_batch_size).items()
        )

    need = total(resolved)
    if need <= limit_bytes:
        return need
    fits = 0
    for budget in range(resolved.block - 1, 0, -1):
        single = ResolvedDDTree(
            budget, resolved.top_k, resolved.allow_hybrid_unsafe, max(budget + 1, resolved.block), resolved.block
        )
        if total(single) <= limit_bytes:
            fits = budget
            break
    for budget in range(resolved.block, MAX_BUDGET + 1):
        single = ResolvedDDTree(budget, resolved.top_k, resolved.allow_hybrid_unsafe, budget + 1, resolved.block)
        if total(single) > limit_bytes:
            break
        fits = budget
    gib = 1 << 30
    raise DDTreeConfigError(
        f"{source} {format_budget(resolved.schedule or resolved.budget)} needs verify windows of "
        f"{sorted(windows_with_batch_sizes(resolved, max_batch_size))} tokens; their CUDA-graph buffers for "
        f"{max_batch_size} requests at context {context_len} take {need / gib:.1f} GiB, over the "
        f"{limit_bytes / gib:.1f} GiB this GPU leaves outside --mem-fraction-static (half of it). "
        f"The largest single budget that fits is {fits}; lower {source}, give large budgets to small "
        "batch sizes only (a schedule such as '1:127,4:63,16:15'), or lower --context-length / "
        "--max-running-requests."
    )


def format_budget(budget: Any) -> str:
    """A budget or schedule as the flag takes it (``"1:127,4:63"``); "auto" for None."""
    if budget is None:
        return "auto"
    if isinstance(budget, (list, tuple)):
        return ",".join(f"{int(bs)}:{int(b)}" for bs, b in budget)
    return str(int(budget))


# ---- hybrid / linear-attention targets -------------------------------------------------------

# model_type values of hybrid (Mamba / linear-attention / SSM) architectures SGLang 0.5.23 serves
# (sglang/srt/configs/hybrid_arch.py and the model registry). Their tree verify needs each node's
# recurrent state from its parent's (adapter/hybrid.py), so such a target runs only when allowed.
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
        f"DDTREE refuses the hybrid target {model_path!r}: {reason}. Its tree verify gives each node the "
        "recurrent state of its parent where SGLang's kernels have that path (Gated DeltaNet, Mamba2), "
        "which is not yet proven on a GPU, and is lossy on every other layout; set "
        f"{FLAG_ALLOW_HYBRID} (or {ENV_ALLOW_HYBRID}=1) to run it anyway (adapter/hybrid.py says which)."
    )
