#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: release
short_description: Build or verify an immutable DDTree overlay release on a host
version_added: 0.1.0
description:
  - A release is C(<root>/<release_id>/) holding C(site/) (the overlay wheel installed with the stack's
    own pip, byte-compiled), C(kernel-cache/) (the GPU kernels compiled and cache-warmed for I(arch)),
    a C(stack) link to the stack it was built for, and C(manifest.json) with the sha256 of every file,
    the stack id and the source revision. The manifest is written last and the tree made read-only.
  - With I(state=present), builds the release unless it exists. A release without a manifest is partial
    (an interrupted build) and is rebuilt. A release whose files differ from its manifest is tampered;
    the module fails, listing the differences, and never rebuilds over it.
  - A build holds a lock on C(<root>/.<release_id>.lock) from the check to the manifest, so a second
    build of the same release on the host waits for the first and then finds it complete, instead of
    removing the first one's files as a partial release. That second build is what a re-run meets when
    the controller of the run before died while its module kept building on the host.
  - With I(state=verified), only checks the manifest and fails on any difference.
  - With O(overlay=false), builds the stack's base release instead - the stack link and the
    O(extra_wheels), nothing of the overlay, no kernels - which the services whose algorithm is not
    DDTREE run (docs/services.md). Its id depends only on the stack and the extra wheels.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  root:
    description: Where releases live.
    type: path
    default: /opt/sglang/releases
  release_id:
    description:
      - The release's id. Required with I(state=verified); with I(state=present) it is derived from
        I(source_hash), I(stack_id) and I(arch) when omitted, so the same content is the same release.
    type: str
  state:
    description: Build if missing (C(present)) or only verify (C(verified)).
    type: str
    choices: [present, verified]
    default: present
  wheel:
    description: The overlay wheel on the host. Required with I(state=present) and O(overlay=true).
    type: path
  overlay:
    description:
      - Build an overlay release (C(true)) or the stack's base release (C(false)), which holds no overlay
        and records C(overlay=false) and source revision C(none) in its manifest.
    type: bool
    default: true
  extra_wheels:
    description:
      - More wheels on the host to install into C(site/) with the overlay (the lab's runtime; none in
        production). Their sha256 is part of the derived I(release_id) and is recorded in the manifest.
    type: list
    elements: path
    default: []
  lock_timeout:
    description:
      - Seconds to wait for another build of the same release on this host before failing with a message
        that names its process. A build compiles the kernels for I(arch), which takes minutes on a GPU host.
    type: int
    default: 1800
  stack:
    description: The stack (venv) the release is for. Required with I(state=present).
    type: path
  stack_id:
    description: The stack's id, recorded in the manifest. Required with I(state=present).
    type: str
  arch:
    description:
      - GPU architecture the kernels are compiled for, like C(sm_120); C(cpu) for hosts without a GPU
        (the lab), where kernel warm-up records that nothing was compiled.
    type: str
    default: cpu
  source_revision:
    description: The source revision recorded in the manifest.
    type: str
    default: unknown
  source_hash:
    description: The overlay's source hash recorded in the manifest.
    type: str
    default: unknown
attributes:
  check_mode:
    support: full
    description: Reports whether a build would happen; verification runs the same.
  diff_mode:
    support: none
    description: The result lists the files and any differences.
"""

EXAMPLES = r"""
- name: Build the release for this host's stack
  ddtree.sglang.release:
    release_id: 9c1d0b7e3f2a
    wheel: /opt/sglang/incoming/ddtree_sglang_overlay-0.1.0-py3-none-any.whl
    stack: /opt/sglang/stacks/3f2a9c1d0b7e
    stack_id: 3f2a9c1d0b7e
    arch: sm_120
    source_revision: 5e1f3a2b9c0d

- name: Build the stack's base release (for the services that do not load the overlay)
  ddtree.sglang.release:
    overlay: false
    stack: /opt/sglang/stacks/3f2a9c1d0b7e
    stack_id: 3f2a9c1d0b7e

- name: Refuse a tampered release
  ddtree.sglang.release:
    release_id: 9c1d0b7e3f2a
    state: verified
"""

RETURN = r"""
release_id:
  description: The release's id.
  returned: always
  type: str
  sample: 9c1d0b7e3f2a
release_dir:
  description: The release directory.
  returned: always
  type: str
  sample: /opt/sglang/releases/9c1d0b7e3f2a
rebuilt_partial:
  description: Whether a partial release (no manifest) was found and rebuilt.
  returned: always
  type: bool
holder:
  description: The process holding the release's build lock (its pid and since when), when the module gave up waiting
    for it.
  returned: when another build held the lock past O(lock_timeout)
  type: dict
  sample: {pid: 4242, since: "2026-12-01T05:02:11Z"}
problems:
  description: Differences between the files and the manifest (tampering); empty when it matches.
  returned: always
  type: list
  elements: str
  sample: ["changed: site/sglang_overlay/core/tree.py (sha256 0a1b2c3d4e5f, manifest 5f4e3d2c1b0a)"]
manifest:
  description: The manifest, without the per-file hashes.
  returned: when the release exists
  type: dict
overlay:
  description: Whether this is an overlay release (C(false) for a base release).
  returned: always
  type: bool
"""

import json
import os
import shutil
import stat
import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils.host_lock import LockTimeout, exclusive
from ansible_collections.ddtree.sglang.plugins.module_utils.release import (
    MANIFEST,
    MANIFEST_FORMAT,
    base_release_id,
    file_sha256,
    manifest_problems,
    release_id,
    tree_hashes,
)


def read_manifest(path):
    with open(os.path.join(path, MANIFEST)) as handle:
        return json.load(handle)


def summary(manifest):
    return {key: value for key, value in manifest.items() if key not in ("files", "links")}


def make_read_only(root):
    for directory, _dirs, names in os.walk(root):
        for name in names:
            path = os.path.join(directory, name)
            if not os.path.islink(path):
                os.chmod(path, os.stat(path).st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))


def run(module, command, env, what):
    rc, stdout, stderr = module.run_command(command, environ_update=env)
    if rc != 0:
        module.fail_json(
            msg="%s failed (exit %d): %s" % (what, rc, (stderr or stdout).strip()[-1500:]),
            cmd=command,
            stdout=stdout,
            stderr=stderr,
            rebuilt_partial=False,
            problems=[],
        )
    return stdout


def build(module, path, extra_wheels):
    params = module.params
    python = os.path.join(params["stack"], "bin", "python")
    site = os.path.join(path, "site")
    cache = os.path.join(path, "kernel-cache")
    os.makedirs(cache)
    env = {"PYTHONPATH": site, "PYTHONNOUSERSITE": "1", "TRITON_CACHE_DIR": cache}
    wheels = ([params["wheel"]] if params["overlay"] else []) + params["extra_wheels"]
    if wheels:
        run(
            module,
            [
                python,
                "-m",
                "pip",
                "install",
                "--no-deps",
                "--no-index",
                "--no-compile",
                "--disable-pip-version-check",
                "--target",
                site,
            ]
            + wheels,
            {"PYTHONNOUSERSITE": "1"},
            "installing the release's wheels",
        )
    else:
        os.makedirs(site)  # a base release in production: the stack alone
    os.symlink(params["stack"], os.path.join(path, "stack"))
    if params["overlay"]:
        warmup = [python, "-m", "sglang_overlay.kernels.warmup", "--cache-dir", cache]
        # No GPU (the lab): the warm-up says nothing was compiled and the cache stays empty.
        warmup += ["--allow-no-gpu"] if params["arch"] == "cpu" else ["--arch", params["arch"]]
        warmup_log = run(module, warmup, env, "compiling and warming the kernels for %s" % params["arch"])
        with open(os.path.join(path, "kernel-warmup.log"), "w") as handle:
            handle.write(warmup_log)
    if wheels:
        run(module, [python, "-m", "compileall", "-q", site], env, "byte-compiling the overlay")
    files, links = tree_hashes(path)
    manifest = {
        "format": MANIFEST_FORMAT,
        "release_id": params["release_id"],
        "stack_id": params["stack_id"],
        "stack": params["stack"],
        "arch": params["arch"],
        "overlay": params["overlay"],
        "source_revision": params["source_revision"] if params["overlay"] else "none",
        "source_hash": params["source_hash"] if params["overlay"] else "none",
        "extra_wheels": extra_wheels,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "files": files,
        "links": links,
    }
    make_read_only(path)
    with open(os.path.join(path, MANIFEST + ".tmp"), "w") as handle:
        json.dump(manifest, handle, indent=1, sort_keys=True)
    os.chmod(os.path.join(path, MANIFEST + ".tmp"), 0o444)
    os.rename(os.path.join(path, MANIFEST + ".tmp"), os.path.join(path, MANIFEST))
    return manifest


def main():
    module = AnsibleModule(
        argument_spec=dict(
            root=dict(type="path", default="/opt/sglang/releases"),
            release_id=dict(type="str"),
            state=dict(type="str", choices=["present", "verified"], default="present"),
            wheel=dict(type="path"),
            overlay=dict(type="bool", default=True),
            extra_wheels=dict(type="list", elements="path", default=[]),
            stack=dict(type="path"),
            stack_id=dict(type="str"),
            arch=dict(type="str", default="cpu"),
            source_revision=dict(type="str", default="unknown"),
            source_hash=dict(type="str", default="unknown"),
            lock_timeout=dict(type="int", default=1800),
        ),
        required_if=[("state", "present", ("stack", "stack_id")), ("state", "verified", ("release_id",))],
        supports_check_mode=True,
    )
    params = module.params
    extra_wheels = []
    for wheel in params["extra_wheels"]:
        if not os.path.isfile(wheel):
            module.fail_json(msg="extra wheel %s is not on the host" % wheel, problems=[], rebuilt_partial=False)
        extra_wheels.append({"wheel": os.path.basename(wheel), "sha256": file_sha256(wheel)})
    if params["state"] == "present" and params["overlay"] and not params["wheel"]:
        module.fail_json(
            msg="an overlay release needs wheel (the overlay wheel on the host); overlay=false builds the base release",
            problems=[],
            rebuilt_partial=False,
        )
    if not params["release_id"] and not params["overlay"]:
        params["release_id"] = base_release_id(params["stack_id"], [extra["sha256"] for extra in extra_wheels])
    elif not params["release_id"]:
        params["release_id"] = release_id(
            params["source_hash"], params["stack_id"], params["arch"], [extra["sha256"] for extra in extra_wheels]
        )
    path = os.path.join(params["root"], params["release_id"])
    if params["state"] == "verified" or module.check_mode:
        settle(module, path, extra_wheels)
    os.makedirs(params["root"], exist_ok=True)
    lock = os.path.join(params["root"], ".%s.lock" % params["release_id"])
    try:
        with exclusive(lock, timeout=params["lock_timeout"]):
            settle(module, path, extra_wheels)
    except LockTimeout as error:
        module.fail_json(
            msg="release %s is being built by another process on this host: %s (lock_timeout %d s). "
            "Wait for it and run again, or stop that process if it is stuck." % (path, error, params["lock_timeout"]),
            release_dir=path,
            problems=["build in progress"],
            rebuilt_partial=False,
            holder=error.holder,
        )


def settle(module, path, extra_wheels):
    """Exit with the release at path verified, reported (check mode, state=verified) or built."""
    params = module.params
    complete = os.path.isfile(os.path.join(path, MANIFEST))
    if complete:
        manifest = read_manifest(path)
        problems = manifest_problems(manifest, *tree_hashes(path))
        if problems:
            module.fail_json(
                msg="release %s is tampered: its files differ from its manifest (%d difference(s): %s). "
                "It will not be activated; remove it to rebuild." % (path, len(problems), "; ".join(problems[:5])),
                release_dir=path,
                problems=problems,
                rebuilt_partial=False,
                manifest=summary(manifest),
            )
        module.exit_json(
            changed=False,
            release_id=params["release_id"],
            release_dir=path,
            problems=[],
            rebuilt_partial=False,
            manifest=summary(manifest),
            overlay=manifest.get("overlay", True),
        )
    partial = os.path.isdir(path)
    if params["state"] == "verified":
        module.fail_json(
            msg="release %s is %s: no manifest. It will not be activated."
            % (path, "partial" if partial else "missing"),
            release_dir=path,
            problems=["no manifest"],
            rebuilt_partial=False,
        )
    if module.check_mode:
        module.exit_json(
            changed=True,
            release_id=params["release_id"],
            release_dir=path,
            problems=[],
            rebuilt_partial=partial,
            overlay=params["overlay"],
        )
    if partial:
        shutil.rmtree(path)
    os.makedirs(path)
    manifest = build(module, path, extra_wheels)
    module.exit_json(
        changed=True,
        release_id=params["release_id"],
        release_dir=path,
        problems=[],
        rebuilt_partial=partial,
        manifest=summary(manifest),
        overlay=params["overlay"],
    )


if __name__ == "__main__":
    main()
