# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The services with the ones the guard switches replaced by their fallback (module_utils/guard.py)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.ddtree.sglang.plugins.module_utils.guard import fallback_services


def guard_fallback(services, switched):
    """sglang_services with each service named in `switched` running its fallback (guard.fallback_services)."""
    if not isinstance(services, list) or not all(isinstance(service, dict) for service in services):
        raise AnsibleFilterError("guard_fallback: the services must be a list of services (sglang_services)")
    if not isinstance(switched, list):
        raise AnsibleFilterError("guard_fallback: the services to switch must be a list of names, got %r" % (switched,))
    unknown = sorted(set(switched) - {service.get("name") for service in services})
    if unknown:
        raise AnsibleFilterError("guard_fallback: no service named %s in the services" % ", ".join(unknown))
    return fallback_services(services, switched)


class FilterModule:
    def filters(self):
        return {"guard_fallback": guard_fallback}
