# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Building a pure-Python project's wheel on the controller (overlay_build).

The project's build backend (PEP 517, named in its pyproject.toml) is called in the controller's own
Python through pyproject_hooks, the library pip and `build` call backends with, without an isolated
build environment: no network and no per-build install of the backend (`pip wheel` makes and fills an
environment from the package index for every build, several times slower, and needs the index;
docs/decisions/overlay-wheel-build.md). The price is that the backend's own requirements must be installed beside
ansible-core: unmet_requirements() names what is missing, so a build never runs with a backend the
project does not accept.
"""

from __future__ import annotations

import os
import traceback

try:
    import tomllib  # Python >= 3.11, as the controller's (overlay_build runs on the controller only)
except ImportError:
    tomllib = None

try:
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement
    from pyproject_hooks import BuildBackendHookCaller, quiet_subprocess_runner
except ImportError:
    BUILD_IMPORT_ERROR = traceback.format_exc()
else:
    BUILD_IMPORT_ERROR = None

# PEP 517's fallback when pyproject.toml names no backend, and PEP 518's requirements when it names none.
LEGACY_BACKEND = "setuptools.build_meta:__legacy__"
DEFAULT_REQUIRES = ("setuptools>=40.8.0",)


def build_system(pyproject_text):
    """The [build-system] table of a pyproject.toml's text (PEP 517/518 defaults filled in)."""
    if tomllib is None:
        raise ValueError("reading pyproject.toml needs Python >= 3.11 (tomllib) on the controller")
    table = tomllib.loads(pyproject_text).get("build-system") or {}
    return {
        "requires": list(table.get("requires", DEFAULT_REQUIRES)),
        "build-backend": table.get("build-backend", LEGACY_BACKEND),
        "backend-path": table.get("backend-path"),
    }


def unmet_requirements(requires, installed_version=None):
    """Each of a backend's requirements this Python does not satisfy, as 'REQUIREMENT (installed: X)'.

    installed_version(name) returns a distribution's version or raises metadata.PackageNotFoundError;
    requirements whose environment marker excludes this Python count as met.
    """
    installed_version = installed_version or metadata.version
    unmet = []
    for text in requires:
        try:
            requirement = Requirement(text)
        except InvalidRequirement as exc:
            unmet.append("%s (not a valid requirement: %s)" % (text, exc))
            continue
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            version = installed_version(requirement.name)
        except metadata.PackageNotFoundError:
            unmet.append("%s (not installed)" % text)
            continue
        if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            unmet.append("%s (installed: %s)" % (text, version))
    return unmet


def build_wheel(tree, out_dir, system, python):
    """Build tree's wheel into out_dir with the backend `system` names, run by `python`; its file name.

    Raises subprocess.CalledProcessError (its output holds the backend's) when the backend fails.
    """
    hooks = BuildBackendHookCaller(
        tree,
        system["build-backend"],
        backend_path=system.get("backend-path"),
        runner=quiet_subprocess_runner,
        python_executable=python,
    )
    return hooks.build_wheel(os.path.abspath(out_dir))
