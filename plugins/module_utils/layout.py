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


def release_stack_ids(services_root, releases_root):
    """{stack_id: ["svc/current", ...]} for every release a service's current or previous link points to."""
    users = {}
    if not os.path.isdir(services_root):
        return users
    for service in sorted(os.listdir(services_root)):
        for link in SERVICE_LINKS:
            path = os.path.join(services_root, service, link)
            if not os.path.islink(path):
                continue
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


def existing_stacks(stacks_root):
    """{stack_id: complete?} for each directory under the stacks root."""
    if not os.path.isdir(stacks_root):
        return {}
    return {
        name: os.path.exists(os.path.join(stacks_root, name, STACK_MARKER))
        for name in sorted(os.listdir(stacks_root))
        if os.path.isdir(os.path.join(stacks_root, name))
    }


def stacks_to_prune(existing, keep, in_use):
    """Stacks that may go: not kept explicitly and not used by any service's current or previous release."""
    return sorted(stack for stack in existing if stack not in keep and stack not in in_use)


def releases_in_use(services_root):
    """{release_id: ["svc/current", ...]} for the releases services' current and previous links name."""
    users = {}
    if not os.path.isdir(services_root):
        return users
    for service in sorted(os.listdir(services_root)):
        for link in SERVICE_LINKS:
            path = os.path.join(services_root, service, link)
            if os.path.islink(path):
                users.setdefault(os.path.basename(os.readlink(path)), []).append("%s/%s" % (service, link))
    return users
