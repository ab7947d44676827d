"""Helpers of the adapter tests: SGLang availability and isolated Python subprocesses."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

OVERLAY_ROOT = Path(__file__).resolve().parents[2]  # sglang_overlay/
SRC = OVERLAY_ROOT / "src"


def sglang_missing_reason() -> Optional[str]:
    """Why SGLang's CPU-importable parts are unavailable here, or None."""
    try:
        if importlib.util.find_spec("sglang") is None:
            return "sglang is not installed"
        import sglang.srt.plugins  # noqa: F401
        import sglang.srt.server_args  # noqa: F401
        import sglang.srt.speculative.spec_info  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means: not importable
        return f"sglang is not importable: {type(exc).__name__}: {exc}"
    return None


_REASON = sglang_missing_reason()
requires_sglang = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


def run_python(
    code: str,
    env: Optional[dict] = None,
    args: tuple = (),
    python_flags: tuple = (),
    timeout: int = 240,
) -> subprocess.CompletedProcess:
    """Run ``code`` in a fresh interpreter of this venv (own SGLang/plugin state)."""
    full_env = dict(os.environ)
    full_env.pop("SGLANG_PLUGINS", None)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, *python_flags, "-c", code, *args],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def last_json_line(proc: subprocess.CompletedProcess) -> dict:
    """The last stdout line that parses as JSON (SGLang may log to stdout too)."""
    for line in reversed(proc.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in stdout:\n{proc.stdout}\n--- stderr:\n{proc.stderr}")


@pytest.fixture(scope="module")
def plugin_in_process():
    """Load the plugin into this (pytest) process, as load_plugins() would, and apply its hooks.

    Registration is idempotent and only adds DDTREE, its flags and hooks that act on DDTree
    records; other tests in this process are unaffected.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_overlay.adapter.plugin import is_loaded, load_plugin

    load_plugin()
    HookRegistry.apply_hooks()
    assert is_loaded()
    return True
