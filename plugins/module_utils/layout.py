# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The host layout (see docs/host-layout.md): stacks, releases, per-service current/previous links.

Readers return plain data; the decisions (what may be pruned) are pure functions of that data.
"""

from __future__ import annotations

import json
import os

STACK_MARKER = ".ddtree-stack-complete"
SERVICE_LINKS = ("current", "previous")


def link_release_id(link: str) -> str | None:
    """The release id a service's link names (the last part of its target), or None when there is no link.

    The one reader of services' links: every module that asks which release a service runs asks here.
    """
    return os.path.basename(os.readlink(link)) if os.path.islink(link) else None


def service_release_ids(services_root: str, service: str) -> dict:
    """{"current": release id or None, "previous": release id or None} of one service."""
    return {link: link_release_id(os.path.join(services_root, service, link)) for link in SERVICE_LINKS}


def release_link_target(services_root: str, service: str, releases_root: str, release_id: str) -> str:
    """What a service's link holds to name a release: the release's path relative to the service's
    directory, so the tree can be moved whole, wherever releases_root is."""
    return os.path.relpath(os.path.join(releases_root, release_id), os.path.join(services_root, service))


def _service_links(services_root):
    """(service, link name, release id) of every service's current and previous link that exists."""
    if not os.path.isdir(services_root):
        return
    for service in sorted(os.listdir(services_root)):
        for link, release_id in service_release_ids(services_root, service).items():
            if release_id:
                yield service, link, release_id


def release_stack_ids(services_root, releases_root):
    """{stack_id: ["svc/current", ...]} for every release a service's current or previous link names."""
    users = {}
    for service, link, release_id in _service_links(services_root):
        try:
            with open(os.path.join(releases_root, release_id, "manifest.json")) as handle:
                stack_id = json.load(handle).get("stack_id")
        except (OSError, ValueError):
            stack_id = None
        if stack_id:
            users.setdefault(stack_id, []).append("%s/%s" % (service, link))
    return users


def releases_in_use(services_root):
    """{release_id: ["svc/current", ...]} for the releases services' current and previous links name."""
    users = {}
    for service, link, release_id in _service_links(services_root):
        users.setdefault(release_id, []).append("%s/%s" % (service, link))
    return users


def directories(root):
    """Names of the directories directly under root, sorted ([] when root does not exist)."""
    if not os.path.isdir(root):
        return []
    return sorted(name for name in os.listdir(root) if os.path.isdir(os.path.join(root, name)))


def existing_stacks(stacks_root):
    """{stack_id: complete?} for each directory under the stacks root."""
    return {name: os.path.exists(os.path.join(stacks_root, name, STACK_MARKER)) for name in directories(stacks_root)}


def unused(existing, keep, in_use):
    """What may be pruned: not kept explicitly and not used by any service's current or previous link."""
    return sorted(name for name in existing if name not in keep and name not in in_use)


def prune_result(root, kind, existing, removed, in_use, diff):
    """The result of a prune module: what goes, what stays in use, and a diff of the listing."""
    result = dict(changed=bool(removed), removed=removed, in_use=in_use)
    if diff:
        header = "%s (%s)" % (root, kind)
        result["diff"] = {
            "before": "".join(name + "\n" for name in sorted(existing)),
            "after": "".join(name + "\n" for name in sorted(set(existing) - set(removed))),
            "before_header": header,
            "after_header": header,
        }
    return result
