# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The controller's cache folder: where slow-to-build things live (wheels, venvs, locks, rollouts).

The rule, once for the Python side (the lookup ddtree.sglang.cache_dir, the rollout lock, scripts/rollout):
$DDTREE_CACHE when set, else $XDG_CACHE_HOME/ddtree-sglang, else ~/.cache/ddtree-sglang.
scripts/lib.sh states it for the shell scripts; tests/unit/test_cache_dir.py holds the two together.
"""

from __future__ import annotations

import os

CACHE_NAME = "ddtree-sglang"


def cache_dir(*parts: str, environ=None) -> str:
    """The cache folder (or a path under it), from environ (default: this process's environment)."""
    environ = os.environ if environ is None else environ
    root = environ.get("DDTREE_CACHE") or os.path.join(
        environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache"),
        CACHE_NAME,
    )
    return os.path.join(root, *parts)
