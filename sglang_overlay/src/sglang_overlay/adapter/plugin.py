"""SGLang plugin entry point of the DDTree overlay.

Declared in pyproject.toml as::

    [project.entry-points."sglang.srt.plugins"]
    ddtree = "sglang_overlay.adapter.plugin:load_plugin"

SGLang's ``load_plugins()`` (sglang/srt/plugins/__init__.py) runs in the launcher and in every
scheduler/detokenizer process: it finds the entry point (from an installed distribution, or from a
``.dist-info`` directory on PYTHONPATH), honours the ``SGLANG_PLUGINS`` whitelist (name ``ddtree``),
calls ``load_plugin()`` with no arguments, then ``HookRegistry.apply_hooks()``. An exception here
is only logged by SGLang, so every failure is logged with a clear message of our own first.
"""

from __future__ import annotations

import logging

from .version_gate import version_mismatch

logger = logging.getLogger("sglang_overlay.adapter")

_loaded = False


def load_plugin() -> None:
    """Register DDTREE, its flags and its resolution hooks (idempotent).

    Refuses, with a logged error and without touching SGLang, on any sglang but 0.5.23.
    """
    global _loaded
    if _loaded:
        return
    problem = version_mismatch()
    if problem is not None:
        logger.error("Failed to load plugin ddtree: %s", problem)
        return
    try:
        from .algorithm import register_ddtree_algorithm, register_worker_selection
        from .hooks import register_startup_hooks
        from .resolution import register_resolution_hooks

        register_ddtree_algorithm()
        register_startup_hooks()
        register_worker_selection()
        register_resolution_hooks()
    except Exception:
        logger.exception("Failed to load plugin ddtree: could not register DDTREE with SGLang")
        raise
    _loaded = True
    logger.info("ddtree plugin loaded: --speculative-algorithm DDTREE is available")


def is_loaded() -> bool:
    return _loaded
