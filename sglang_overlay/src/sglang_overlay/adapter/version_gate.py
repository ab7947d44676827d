"""The adapter patches private SGLang internals, so it runs against exactly one SGLang release."""

from __future__ import annotations

import importlib.metadata
from typing import Optional

SUPPORTED_SGLANG_VERSION = "0.5.23"


def installed_sglang_version() -> Optional[str]:
    """The version of the sglang that ``import sglang`` gives, or None when there is none.

    The imported package is asked first (a source tree on PYTHONPATH can shadow the installed
    distribution); the distribution metadata is the fallback.
    """
    try:
        from sglang.version import __version__  # light: no torch, no srt

        return str(__version__)
    except Exception:
        pass
    try:
        return importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return None


def version_mismatch(version: Optional[str] = None) -> Optional[str]:
    """None when the running sglang is the supported one, else a message saying why not."""
    found = installed_sglang_version() if version is None else version
    if found == SUPPORTED_SGLANG_VERSION:
        return None
    return (
        f"ddtree-sglang-overlay supports sglang=={SUPPORTED_SGLANG_VERSION} exactly and found "
        f"sglang {found or '(not installed)'}; the DDTREE plugin patches private SGLang internals "
        "and refuses to touch any other version: nothing was patched and --speculative-algorithm "
        "DDTREE stays unknown"
    )
