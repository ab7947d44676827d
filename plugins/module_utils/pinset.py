# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Pin sets: which wheels fit a host, and the pip commands that fetch and install exactly a lock."""

from __future__ import annotations

import hashlib

PIP_NO_RESOLVE = ["--require-hashes", "--no-deps", "--only-binary=:all:"]


def wheel_platforms(glibc):
    """Wheel platform tags an x86_64 host with this glibc (e.g. "2.36") accepts, newest first."""
    major, minor = (int(part) for part in str(glibc).split(".")[:2])
    if major != 2 or minor < 17:
        raise ValueError("glibc %r: expected a version like 2.36 (2.17 or later)" % (glibc,))
    tags = ["manylinux_2_%d_x86_64" % value for value in range(minor, 16, -1)]
    return tags + ["manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64", "linux_x86_64"]


def lock_name(python):
    """'3.11' or '3.11.2' -> 'requirements-py311.lock'."""
    major, minor = str(python).split(".")[:2]
    return "requirements-py%s%s.lock" % (major, minor)


def stack_id(pinset, lock_text):
    """A stack's id: the short sha256 of its pin set's name and resolved lock (so, of every pin and hash)."""
    return hashlib.sha256(("%s\n%s" % (pinset, lock_text)).encode("utf-8")).hexdigest()[:12]


def download_command(python_executable, lock, dest, python, glibc, index_url=None, extra_index_urls=()):
    """pip download of exactly the lock's files for the target Python and glibc."""
    command = [python_executable, "-m", "pip", "download", "--disable-pip-version-check", "--quiet"] + PIP_NO_RESOLVE
    command += ["--python-version", python, "--implementation", "cp", "--dest", dest, "-r", lock]
    for platform in wheel_platforms(glibc):
        command += ["--platform", platform]
    if index_url:
        command += ["--index-url", index_url]
    for url in extra_index_urls:
        command += ["--extra-index-url", url]
    return command


def install_command(stack_python, lock, wheelhouse=None, index_url=None, extra_index_urls=()):
    """pip install of exactly the lock into a stack: offline from a wheelhouse, or from indexes."""
    command = [stack_python, "-m", "pip", "install", "--disable-pip-version-check", "--no-cache-dir"] + PIP_NO_RESOLVE
    if wheelhouse:
        command += ["--no-index", "--find-links", wheelhouse]
    else:
        if index_url:
            command += ["--index-url", index_url]
        for url in extra_index_urls:
            command += ["--extra-index-url", url]
    return command + ["-r", lock]
