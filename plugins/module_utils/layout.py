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


def _service_links(services_root):
    """(service, link name, path) of every service's current and previous link that exists."""
    if not os.path.isdir(services_root):
        return
    for service in sorted(os.listdir(services_root)):
        for link in SERVICE_LINKS:
            path = os.path.join(services_root, service, link)
            if os.path.islink(path):
                yield service, link, path


def release_stack_ids(services_root, releases_root):
    """{stack_id: ["svc/current", ...]} for every release a service's current or previous link points to."""
    users = {}
    for service, link, path in _service_links(services_root):
        release = os.path.realpath(path)
        if os.path.dirname(release) != os.path.realpath(releases_root):
            continue
        try:
            with open(os.path.join(release, "manifest.json")) as handle:
                stack_id = json.load(handle).get("stack_id")
        except (OSError, ValueError):
            stack_id = None
        if stack_id:
            users.setdefault(stack_id, []).append("%s/%s" % (service, link))
    return users


def releases_in_use(services_root):
    """{release_id: ["svc/current", ...]} for the releases services' current and previous links name."""
    users = {}
    for service, link, path in _service_links(services_root):
        users.setdefault(os.path.basename(os.readlink(path)), []).append("%s/%s" % (service, link))
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
        result["diff"] = {"before": "".join(name + "\n" for name in sorted(existing)),
                          "after": "".join(name + "\n" for name in sorted(set(existing) - set(removed))),
                          "before_header": header, "after_header": header}
    return result
