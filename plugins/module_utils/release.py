# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Immutable overlay releases: ids, manifests (sha256 of every file) and their verification.

A release directory holds `site/` (the overlay installed for one stack), `kernel-cache/`, a `stack`
link to the stack it was built for, and `manifest.json`, written last: a release without a manifest
is partial; one whose files differ from its manifest is tampered. Neither is ever activated.
"""

from __future__ import annotations

import hashlib
import json
import os

MANIFEST = "manifest.json"
MANIFEST_FORMAT = 1


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def tree_hashes(root):
    """{relative path: sha256} for every regular file under root, and {relative path: target} for links.

    The manifest itself is left out. Directories are implied by their files.
    """
    files, links = {}, {}
    for directory, subdirs, names in os.walk(root):
        subdirs.sort()
        for name in sorted(names) + [d for d in subdirs if os.path.islink(os.path.join(directory, d))]:
            path = os.path.join(directory, name)
            rel = os.path.relpath(path, root)
            if rel == MANIFEST:
                continue
            if os.path.islink(path):
                links[rel] = os.readlink(path)
            elif os.path.isfile(path):
                files[rel] = file_sha256(path)
    return files, links


def source_hash(files):
    """Hash of a source tree from {relative path: sha256}: the content identity of an overlay build."""
    digest = hashlib.sha256()
    for rel in sorted(files):
        digest.update(("%s\0%s\n" % (rel, files[rel])).encode("utf-8"))
    return digest.hexdigest()


def release_id(overlay_source_hash, stack_id, arch, extra_wheel_hashes=()):
    """A release is one overlay source, built for one stack and one GPU architecture ('cpu' in the lab),
    with the extra wheels installed beside it (none in production, where the id is that of the three)."""
    identity = "%s\n%s\n%s" % (overlay_source_hash, stack_id, arch)
    identity += "".join("\n%s" % digest for digest in extra_wheel_hashes)
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:12]


def base_release_id(stack_id, extra_wheel_hashes=()):
    """The base release of a stack: the stack and the extra wheels, no overlay (what a service whose
    algorithm is not DDTREE runs). Independent of the overlay's source, so an overlay change leaves it as
    it is; "base" in the identity keeps it apart from every overlay release."""
    identity = "base\n%s" % stack_id
    identity += "".join("\n%s" % digest for digest in extra_wheel_hashes)
    return hashlib.sha256(identity.encode("utf-8")).hexdigest()[:12]


def manifest_problems(manifest, files, links):
    """Why a release's files do not match its manifest; [] when they do.

    Lists files changed, missing and added (a planted module is as bad as an edited one), and links
    changed.
    """
    problems = []
    want_files, want_links = manifest.get("files", {}), manifest.get("links", {})
    for rel in sorted(set(want_files) | set(files)):
        if rel not in files:
            problems.append("missing: %s" % rel)
        elif rel not in want_files:
            problems.append("added: %s" % rel)
        elif files[rel] != want_files[rel]:
            problems.append("changed: %s (sha256 %s, manifest %s)" % (rel, files[rel][:12], want_files[rel][:12]))
    for rel in sorted(set(want_links) | set(links)):
        if links.get(rel) != want_links.get(rel):
            problems.append("link %s -> %s, manifest says %s" % (rel, links.get(rel), want_links.get(rel)))
    return problems


def verify_release(path):
    """[] when path is a complete release whose files match its manifest, else what is wrong."""
    if not os.path.isfile(os.path.join(path, MANIFEST)):
        return ["no manifest (a partial or missing release)"]
    with open(os.path.join(path, MANIFEST)) as handle:
        manifest = json.load(handle)
    return manifest_problems(manifest, *tree_hashes(path))
