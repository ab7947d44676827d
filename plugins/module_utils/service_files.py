# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The files a service's unit starts with (docs/services.md): its state directory, its environment, its API key
(root's alone: systemd opens it as the server's standard input) and its unit. Which of them a run must write,
and which changed, is decided here from what is on the host; ddtree.sglang.service_files writes them."""

from __future__ import annotations

import difflib

# What a service reads when it starts, by file: a change to any of them restarts it (service_actions).
FILE_KINDS = ("environment", "api_key", "unit")


def service_paths(name: str, unit: str, config_dir: str, state_root: str, systemd_dir: str) -> dict:
    """Where service `name`'s files live: {state_dir, environment, api_key, unit}."""
    return {
        "state_dir": "%s/%s" % (state_root, name),
        "environment": "%s/%s.env" % (config_dir, name),
        "api_key": "%s/%s.api-key" % (config_dir, name),
        "unit": "%s/%s" % (systemd_dir, unit),
    }


def wanted_files(paths: dict, unit_file: str, environment_file: str, api_key: str | None) -> list:
    """Each file as it must be: {kind, path, content (None: absent), mode}. The environment may hold tokens and
    the key is a secret: both are root's alone (0600); the unit is world-readable, as systemd's are. A service
    without a key has no key file."""
    return [
        {"kind": "environment", "path": paths["environment"], "content": environment_file, "mode": 0o600},
        {
            "kind": "api_key",
            "path": paths["api_key"],
            "content": None if not api_key else api_key + "\n",
            "mode": 0o600,
        },
        {"kind": "unit", "path": paths["unit"], "content": unit_file, "mode": 0o644},
    ]


def file_differs(wanted: dict, current: dict | None) -> bool:
    """Whether a file must be written or removed: `current` is what is on the host ({content, mode, uid, gid}, or
    None when there is no file). A file is root's: another owner, group or mode is rewritten too."""
    if wanted["content"] is None:
        return current is not None
    if current is None:
        return True
    return (current["content"], current["mode"], current["uid"], current["gid"]) != (
        wanted["content"],
        wanted["mode"],
        0,
        0,
    )


def directory_differs(current: dict | None, mode: int, uid: int, gid: int) -> bool:
    """Whether the state directory must be created or its mode or owner set (`current`: {mode, uid, gid} or None)."""
    return current is None or (current["mode"], current["uid"], current["gid"]) != (mode, uid, gid)


def file_diff(path: str, before: str | None, after: str | None) -> str:
    """A file's change as a unified diff (what --diff shows of it): the text it had (None: no file) against the
    text it gets (None: removed)."""
    lines = difflib.unified_diff(
        (before or "").splitlines(True), (after or "").splitlines(True), "before: " + path, "after: " + path
    )
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)
