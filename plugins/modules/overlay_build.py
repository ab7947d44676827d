#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: overlay_build
short_description: Build the DDTree overlay wheel from this repository, once per source content
version_added: 0.1.0
description:
  - Hashes the overlay's source (C(pyproject.toml) and C(src/)), and builds its wheel into
    C(<dest>/<source_hash>/) unless a wheel for that content is there.
  - Builds with the build backend the source's C(pyproject.toml) names (PEP 517, called through
    C(pyproject_hooks)) in the controller's own Python, without an isolated build environment. No
    package index is needed, and a build costs about a tenth of C(pip wheel)'s, which filled a fresh
    environment for every build. The backend's requirements (C(setuptools>=77) for the overlay) must
    be installed beside ansible-core; the module fails naming any that is not, before building.
  - Returns the content hash (part of every release id, so the same content deploys as the same
    release) and the source revision (the Git commit, with C(+dirty) when the tree has changes).
  - Runs on the controller (C(delegate_to=localhost), C(run_once=true)).
requirements:
  - Python >= 3.11 on the controller (C(tomllib)).
  - pyproject_hooks and packaging, and the source's build requirements (C(setuptools>=77) for the overlay),
    as C(requirements/ee-python.txt) lists them for an execution environment; C(scripts/bootstrap)'s venv has them.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  source:
    description: The overlay's directory (holding C(pyproject.toml)).
    type: path
    required: true
  dest:
    description: Cache directory for wheels, one subdirectory per source hash.
    type: path
    required: true
attributes:
  check_mode:
    support: full
    description: Reports whether a build would happen, and builds nothing.
  diff_mode:
    support: none
    description: A wheel is binary; the result names it.
"""

EXAMPLES = r"""
- name: Build the overlay on the controller
  ddtree.sglang.overlay_build:
    source: "{{ playbook_dir }}/../sglang_overlay"
    dest: "{{ lookup('ddtree.sglang.cache_dir', 'overlay') }}"
  delegate_to: localhost
  run_once: true
  register: overlay
"""

RETURN = r"""
wheel:
  description: Path of the wheel on the controller.
  returned: always
  type: str
  sample: /root/.cache/ddtree-sglang/overlay/5d0c.../ddtree_sglang_overlay-0.1.0-py3-none-any.whl
source_hash:
  description: sha256 over the overlay's source files.
  returned: always
  type: str
revision:
  description: The Git commit of the source, C(+dirty) when it has uncommitted changes; C(unknown) outside Git.
  returned: always
  type: str
  sample: 3f2a9c1d0b7e+dirty
"""

import glob
import os
import shutil
import subprocess
import sys
import tempfile

from ansible.module_utils.basic import AnsibleModule, missing_required_lib

from ansible_collections.ddtree.sglang.plugins.module_utils.python_build import (
    BUILD_IMPORT_ERROR,
    build_system,
    build_wheel,
    unmet_requirements,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.release import file_sha256, source_hash


def overlay_source_files(source):
    files = {"pyproject.toml": file_sha256(os.path.join(source, "pyproject.toml"))}
    for directory, subdirs, names in os.walk(os.path.join(source, "src")):
        subdirs[:] = sorted(d for d in subdirs if d != "__pycache__" and not d.endswith(".egg-info"))
        for name in sorted(names):
            if name.endswith((".pyc", ".pyo")):
                continue
            path = os.path.join(directory, name)
            files[os.path.relpath(path, source)] = file_sha256(path)
    return files


def git_revision(module, source):
    git = module.get_bin_path("git")
    if not git:
        return "unknown"
    rc, commit, dummy = module.run_command([git, "-C", source, "rev-parse", "--short=12", "HEAD"])
    if rc != 0:
        return "unknown"
    rc, status, dummy = module.run_command([git, "-C", source, "status", "--porcelain", "--", "."])
    return commit.strip() + ("+dirty" if status.strip() else "")


def main():
    module = AnsibleModule(
        argument_spec=dict(source=dict(type="path", required=True), dest=dict(type="path", required=True)),
        supports_check_mode=True,
    )
    source, dest = module.params["source"], module.params["dest"]
    if not os.path.isfile(os.path.join(source, "pyproject.toml")):
        module.fail_json(msg="source %s has no pyproject.toml; point it at the sglang_overlay directory" % source)
    content = source_hash(overlay_source_files(source))
    target = os.path.join(dest, content)
    revision = git_revision(module, source)
    existing = sorted(glob.glob(os.path.join(target, "*.whl")))
    if existing:
        module.exit_json(changed=False, wheel=existing[0], source_hash=content, revision=revision)
    if module.check_mode:
        module.exit_json(changed=True, wheel=None, source_hash=content, revision=revision)
    if BUILD_IMPORT_ERROR:
        module.fail_json(
            msg=missing_required_lib("pyproject_hooks and packaging (requirements/ee-python.txt)"),
            exception=BUILD_IMPORT_ERROR,
        )
    try:
        with open(os.path.join(source, "pyproject.toml"), encoding="utf-8") as handle:
            system = build_system(handle.read())
    except ValueError as exc:
        module.fail_json(msg="cannot read the build system of %s: %s" % (os.path.join(source, "pyproject.toml"), exc))
    unmet = unmet_requirements(system["requires"])
    if unmet:
        module.fail_json(
            msg="the build backend of %s needs %s in the controller's Python %s; install them beside ansible-core "
            "(requirements/ee-python.txt, or scripts/bootstrap's venv)" % (source, ", ".join(unmet), sys.executable),
            unmet=unmet,
        )
    staging = tempfile.mkdtemp(prefix="overlay-wheel-")
    try:
        # Build from a copy: setuptools writes build/ and *.egg-info next to the source.
        tree = os.path.join(staging, "src-copy")
        shutil.copytree(
            source,
            tree,
            ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build", "dist", "tests", ".pytest_cache"),
        )
        out = os.path.join(staging, "wheel")
        os.makedirs(out)
        try:
            name = build_wheel(tree, out, system, sys.executable)
        except subprocess.CalledProcessError as exc:
            output = exc.output.decode("utf-8", "replace") if isinstance(exc.output, bytes) else (exc.output or "")
            module.fail_json(
                msg="building the wheel of %s with %s failed (exit %d): %s"
                % (source, system["build-backend"], exc.returncode, output.strip()[-1500:]),
                rc=exc.returncode,
            )
        os.makedirs(target, exist_ok=True)
        final = os.path.join(target, name)
        shutil.move(os.path.join(out, name), final + ".tmp")
        os.rename(final + ".tmp", final)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    module.exit_json(changed=True, wheel=final, source_hash=content, revision=revision)


if __name__ == "__main__":
    main()
