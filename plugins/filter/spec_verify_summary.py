# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What the sglang_service role shows after its spec_verify loop (module_utils/spec_matrix.py holds it)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.ddtree.sglang.plugins.module_utils.spec_matrix import verify_summary


def spec_verify_summary(results):
    """The predicate matrix with the release active, and the services whose pass was recorded."""
    if not isinstance(results, list) or not all(isinstance(result, dict) for result in results):
        raise AnsibleFilterError("spec_verify_summary takes the results of a spec_verify loop, got %r" % (results,))
    return verify_summary(results)


class FilterModule:
    def filters(self):
        return {"spec_verify_summary": spec_verify_summary}
