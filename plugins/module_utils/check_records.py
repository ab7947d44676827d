# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Recorded passes of the checks that run in a stack (spec_verify, stack_verify).

Both checks start the stack's Python and import torch and SGLang: seconds of CPU each, on every deploy,
though what they check is immutable - a stack and a release never change once built. So a pass is
recorded on the host, keyed by a digest of everything the check depends on:

    <state_root>/_checks/<check>/<key>.json
    {"format": 1, "check": ..., "key": ..., "recorded_at": ..., "result": {...the module's result...}}

A later run with the same key returns the recorded result instead of checking again. The key covers the
check's options, the module's own code (a new collection checks again) and fingerprints of what the check
reads from disk: a stack's completion marker, its site-packages listing and each distribution's RECORD
(size, mtime), the interpreter it runs; a release's manifest and every file under its site/ (size,
mtime in whole seconds). A changed file there is a new key, so tampering still gets checked (and the release module
hashes every file of a release on each run anyway). docs/host-layout.md ("Recorded checks") has the
decision. A failed check records nothing; neither does check mode.
"""

from __future__ import annotations

import glob
import hashlib
import importlib.util
import json
import os
import tempfile
import time

from ansible_collections.ddtree.sglang.plugins.module_utils.layout import STACK_MARKER

FORMAT = 1
# Under the state root; not a service name (services.py: lowercase letters, digits and '-').
RECORDS_DIR = "_checks"
# Records kept per check: a host sees a handful of stacks and releases at a time.
KEEP = 100
RELEASE_MANIFEST = "manifest.json"


def utc_now() -> str:
    """When a pass is recorded, as the gate's verdicts write it."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def digest(value) -> str:
    """sha256 of value as canonical JSON."""
    return hashlib.sha256(json.dumps(value, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def file_digest(path):
    """sha256 of a file's bytes, or None when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            return hashlib.sha256(handle.read()).hexdigest()
    except OSError:
        return None


def stat_entry(path):
    """[size, mtime in whole seconds] of a path (not followed), or None when it is missing.

    Whole seconds: a stack committed into a container image (the lab's) or copied by tar keeps no finer
    mtime, and its recorded pass must still be its own. An edit changes the size or the second, and the
    release module hashes every file of a release anyway.
    """
    try:
        info = os.lstat(path)
    except OSError:
        return None
    return [info.st_size, int(info.st_mtime)]


def tree_stats(root):
    """[[relative path, size, mtime s] or [relative path, link target]] for every file and link under root."""
    entries = []
    for directory, subdirs, names in os.walk(root):
        subdirs.sort()
        for name in sorted(names) + sorted(d for d in subdirs if os.path.islink(os.path.join(directory, d))):
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root)
            entries.append([rel, os.readlink(path)] if os.path.islink(path) else [rel] + (stat_entry(path) or []))
    return entries


def stack_fingerprint(stack):
    """What a stack check reads from a stack, cheaply: its completion marker, the interpreter it runs,
    and per site-packages directory each entry's name, with size and mtime for files and for each
    distribution's RECORD (a pip install, upgrade or removal changes them)."""
    python = os.path.realpath(os.path.join(stack, "bin", "python"))
    site_packages = {}
    for directory in sorted(glob.glob(os.path.join(stack, "lib", "python*", "site-packages"))):
        entries = []
        for name in sorted(os.listdir(directory)):
            path = os.path.join(directory, name)
            if name.endswith(".dist-info"):
                entries.append([name, stat_entry(os.path.join(path, "RECORD"))])
            elif os.path.isdir(path) and not os.path.islink(path):
                entries.append([name])
            else:
                entries.append([name, stat_entry(path)])
        site_packages[os.path.relpath(directory, stack)] = entries
    return {
        "marker": file_digest(os.path.join(stack, STACK_MARKER)),
        "python": [python, stat_entry(python)],
        "site_packages": site_packages,
    }


def release_fingerprint(release):
    """What a check reads from a release: its manifest and every file under its site/ (size, mtime)."""
    return {
        "manifest": file_digest(os.path.join(release, RELEASE_MANIFEST)),
        "site": tree_stats(os.path.join(release, "site")),
    }


def code_version(module_names):
    """sha256 over the source of the named Python modules (the check's module and what it imports), as
    their loaders give it - also from AnsiballZ's zip. None when a source cannot be read: record nothing."""
    sources = hashlib.sha256()
    for name in module_names:
        try:
            spec = importlib.util.find_spec(name)
            source = spec.loader.get_source(name) if spec is not None and spec.loader is not None else None
        except (ImportError, OSError, ValueError):
            source = None
        if source is None:
            return None
        sources.update(name.encode() + b"\0" + source.encode() + b"\0")
    return sources.hexdigest()


def record_key(check, code, inputs):
    """The record's key: the check's name, the record format, its code version and every input."""
    return digest({"format": FORMAT, "check": check, "code": code, "inputs": inputs})


def record_path(state_root, check, key):
    """Where one check's record for one key lives."""
    return os.path.join(state_root, RECORDS_DIR, check, key + ".json")


def read_record(path, check, key):
    """The recorded record at path if it is a well-formed pass of this check with this key, else None."""
    try:
        with open(path) as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    if (
        not isinstance(record, dict)
        or record.get("format") != FORMAT
        or record.get("check") != check
        or record.get("key") != key
    ):
        return None
    return record if isinstance(record.get("result"), dict) else None


def find_record(state_root, check, module_names, inputs, complete):
    """Where a pass of this check with these inputs is recorded, and the record if there is one:
    {"path", "key", "record" (None when not recorded yet)}. None when nothing is to be recorded: no
    state root, a stack or release not complete (no marker, no manifest), or the code's source unknown."""
    code = code_version(module_names) if state_root and complete else None
    if code is None:
        return None
    key = record_key(check, code, inputs)
    path = record_path(state_root, check, key)
    return {"path": path, "key": key, "record": read_record(path, check, key)}


def recorded_result(slot):
    """The module's result from a recorded pass: the recorded result, unchanged, saying it was recorded."""
    record = slot["record"]
    return dict(
        record["result"],
        changed=False,
        recorded=True,
        recorded_at=record["recorded_at"],
        record=slot["path"],
        msg="passed before with the same stack, release, options and code (recorded at %s in %s): not checked again"
        % (record["recorded_at"], slot["path"]),
    )


def write_record(path, check, key, result, recorded_at, keep=KEEP):
    """Write a pass's record whole (a temporary file renamed over it), then drop the oldest records of
    the check beyond keep. Returns the record."""
    record = {"format": FORMAT, "check": check, "key": key, "recorded_at": recorded_at, "result": result}
    directory = os.path.dirname(path)
    os.makedirs(directory, mode=0o755, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".record-", suffix=".tmp")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(record, out, sort_keys=True)
            out.flush()
            os.fsync(out.fileno())
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
    prune_records(directory, keep)
    return record


def record_pass(slot, check, result, check_mode):
    """Finish a passed check's result: write its record in slot (find_record's) unless in check mode, and name
    where the record is (or would be) in result["record"]. No slot: nothing to record. Returns result."""
    if slot:
        if not check_mode:
            write_record(slot["path"], check, slot["key"], result, utc_now())
        result["record"] = slot["path"]
    return result


def prune_records(directory, keep):
    """Remove all but the keep newest records (by mtime) in a check's directory."""
    records = [os.path.join(directory, name) for name in os.listdir(directory) if name.endswith(".json")]
    records.sort(key=lambda path: (os.path.getmtime(path), path), reverse=True)
    for path in records[keep:]:
        try:
            os.unlink(path)
        except OSError:
            pass
