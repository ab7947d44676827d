"""The overlay's environment variables, each declared once: name, type, default and a doc line.

Modelled on SGLang's ``srt/environ.py``: a knob is a typed field whose ``get()`` reads the
environment when it is called, never at import, so a server's environment and a test's
``monkeypatch.setenv`` both apply. An empty variable counts as unset (systemd's ``Environment=NAME=``).
A value that does not parse is logged as a warning and the default applies, as SGLang does: these
knobs switch measurement and fallback paths, and a typo must not stop a serving process.

The DDTree flags' environment fallbacks (``SGLANG_DDTREE_BUDGET``, ``SGLANG_DDTREE_TOP_K``,
``SGLANG_DDTREE_ALLOW_HYBRID_UNSAFE``) are declared here too, as ``FlagFallback`` knobs: ``adapter.settings``
reads their text (``raw()``) and parses it with the flag's own rules, the flag beating the variable and a bad
value failing the start with an error naming the variable (a bad budget is no measurement switch).

No import of torch, triton, sglang or the rest of the package: any layer may import this module.
``python -m sglang_overlay.knobs`` prints the table that docs/adapter.md carries (a test compares).
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping, Optional

logger = logging.getLogger(__name__)

__all__ = ["Knob", "EnvBool", "EnvInt", "EnvStr", "FlagFallback", "ALL", "markdown_table"]


class Knob:
    """One environment variable: ``name``, ``default``, a one-line ``doc``; ``get()`` parses it now."""

    kind = "str"

    def __init__(self, name: str, *, default: Any, doc: str):
        self.name = name
        self.default = default
        self.doc = doc

    def parse(self, raw: str) -> Any:
        raise NotImplementedError

    def raw(self, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
        """The variable's text, stripped; None when unset or empty."""
        value = (os.environ if environ is None else environ).get(self.name)
        if value is None or not value.strip():
            return None
        return value.strip()

    def get(self, environ: Optional[Mapping[str, str]] = None) -> Any:
        """The typed value from ``environ`` (default: the process environment), or ``default``."""
        raw = self.raw(environ)
        if raw is None:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            logger.warning("%s=%r is not valid (%s); using the default %r", self.name, raw, exc, self.default)
            return self.default

    def is_set(self, environ: Optional[Mapping[str, str]] = None) -> bool:
        return self.raw(environ) is not None

    def __bool__(self) -> bool:
        raise TypeError(f"use {self.name}'s .get(), not the knob itself, as a truth value")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, default={self.default!r})"


class EnvBool(Knob):
    """1/0, true/false, yes/no, on/off (any case)."""

    kind = "bool"
    TRUE = ("1", "true", "yes", "on")
    FALSE = ("0", "false", "no", "off")

    def parse(self, raw: str) -> bool:
        text = raw.lower()
        if text in self.TRUE:
            return True
        if text in self.FALSE:
            return False
        raise ValueError("expected 1/0, true/false, yes/no or on/off")


class EnvInt(Knob):
    kind = "int"

    def parse(self, raw: str) -> int:
        return int(raw)


class EnvStr(Knob):
    kind = "str"

    def parse(self, raw: str) -> str:
        return raw


class FlagFallback(Knob):
    """A DDTree flag's environment fallback: ``adapter.settings`` reads ``raw()`` and parses it with the flag's
    parser, which refuses a bad value (``get()`` gives the text unparsed)."""

    kind = "flag fallback"

    def __init__(self, name: str, *, flag: str, doc: str):
        super().__init__(name, default=None, doc=doc)
        self.flag = flag

    def parse(self, raw: str) -> str:
        return raw


# The DDTree flags' environment fallbacks (adapter.settings parses them) ---------------------------------

BUDGET = FlagFallback(
    "SGLANG_DDTREE_BUDGET",
    flag="--speculative-ddtree-budget",
    doc="The budget when --speculative-ddtree-budget is not given: an integer (nodes besides the root) or a "
    "schedule BS:BUDGET,...; unset: the drafter's block minus the root.",
)
TOP_K = FlagFallback(
    "SGLANG_DDTREE_TOP_K",
    flag="--speculative-ddtree-top-k",
    doc="The per-position candidates when --speculative-ddtree-top-k is not given; unset: the budget's default.",
)
ALLOW_HYBRID_UNSAFE = FlagFallback(
    "SGLANG_DDTREE_ALLOW_HYBRID_UNSAFE",
    flag="--speculative-ddtree-allow-hybrid-unsafe",
    doc="1/0, true/false, yes/no or on/off when --speculative-ddtree-allow-hybrid-unsafe is not given; unset: "
    "off (a hybrid target is refused).",
)

# Verify path -----------------------------------------------------------------------------------------

TREE_ATTENTION = EnvBool(
    "DDTREE_TREE_ATTENTION",
    default=True,
    doc="The target's tree verify attention runs the overlay's grouped kernel (kernels.tree_attention); "
    "off keeps SGLang's Triton extend kernel with the FULL mask.",
)
TREE_ATTENTION_CONFIG = EnvStr(
    "DDTREE_TREE_ATTENTION_CONFIG",
    default="",
    doc="ROWS,BLOCK_N,WARPS: the grouped kernel's tile (rows per program at most, K/V columns per tile, "
    "warps); empty: the GPU's row of kernels.tree_attention.TILES. For measurements.",
)
DRAFT_TOPK_SPAN = EnvInt(
    "DDTREE_DRAFT_TOPK_SPAN",
    default=None,
    doc="Chunks per selection program of the fused draft top-k (1, 2, 4, 8 or 16) for every shape; "
    "unset: kernels.draft_topk.SPAN_TABLE, else 1.",
)
PATH_KV_MOVE = EnvBool(
    "DDTREE_PATH_KV_MOVE",
    default=True,
    doc="The commit moves each accepted path's KV with kernels.kv_move (nothing when it is in place); "
    "off keeps SGLang's move of every window entry in every layer.",
)
EXACT_MASK_SIZE = EnvBool(
    "DDTREE_EXACT_MASK_SIZE",
    default=False,
    doc="Size each step's FULL mask exactly from the device lengths (one host sync a step) instead of "
    "the bound from SGLang's reserved lengths. For measuring and debugging.",
)
IN_PLACE_TREE_MASK = EnvBool(
    "DDTREE_IN_PLACE_TREE_MASK",
    default=False,
    doc="The tree stage writes the FULL mask into the Triton backend's verify-mask buffer instead of a "
    "fresh tensor each step.",
)

# A/B switches: the tree step without its CUDA graphs -----------------------------------------------------

EAGER_TREE_STAGE = EnvBool(
    "DDTREE_EAGER_TREE_STAGE",
    default=False,
    doc="Run the tree stage eagerly every step instead of replaying its CUDA graph. For A/B measurements.",
)
EAGER_TREE_VERIFY = EnvBool(
    "DDTREE_EAGER_TREE_VERIFY",
    default=False,
    doc="Capture DFLASH's causal verify graphs and run the tree verify eagerly (the graph guard refuses "
    "every replay). For A/B measurements.",
)

# Diagnostics --------------------------------------------------------------------------------------------

PLANT_PATH = EnvStr(
    "DDTREE_PLANT_PATH",
    default="",
    doc="RANK DEPTH (RANK first, middle or last), or @FILE holding it (re-read when it changes): every step "
    "accepts that path instead of the target's (kernels.plant_path). Lossy: the step-cost benchmark's "
    "instrument, never for serving.",
)

HYBRID_CHAIN_STATE = EnvBool(
    "DDTREE_HYBRID_CHAIN_STATE",
    default=False,
    doc="On a hybrid target, leave the linear-attention verify as DFLASH built it (a chain: each tree node "
    "continues from its predecessor in the window, not its parent). Lossy: the planted control of the "
    "hybrid lossless checks, never for serving.",
)

STEP_TIMING = EnvInt(
    "DDTREE_STEP_TIMING",
    default=0,
    doc="N > 0: log the mean host milliseconds of each part of the tree step every N steps "
    "(adapter.diagnostics.StepTimer).",
)
SYNC_DEBUG = EnvInt(
    "DDTREE_SYNC_DEBUG",
    default=0,
    doc="N > 0: count the places where the tree step makes the host wait for the GPU (torch's CUDA sync "
    "debug mode) and log the busiest every N steps (adapter.diagnostics.SyncWatch).",
)

#: Every knob above, in declaration order (the docs table's order).
ALL: tuple[Knob, ...] = tuple(value for value in list(globals().values()) if isinstance(value, Knob))


def _default_text(knob: Knob) -> str:
    if knob.default is None or knob.default == "":
        return "unset"
    if isinstance(knob.default, bool):
        return "on" if knob.default else "off"
    return str(knob.default)


def markdown_table() -> str:
    """The knobs as the Markdown table of docs/adapter.md (one row per knob, declaration order)."""
    rows = ["| variable | type | default | what |", "| --- | --- | --- | --- |"]
    rows += [f"| `{k.name}` | {k.kind} | {_default_text(k)} | {k.doc} |" for k in ALL]
    return "\n".join(rows) + "\n"


if __name__ == "__main__":
    print(markdown_table(), end="")
