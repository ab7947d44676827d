# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The pip command that installs exactly a pin set's lock into a stack (module_utils/pinset.py holds it, so the
sglang_stack role and the pinsets test stage run the same command)."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.ddtree.sglang.plugins.module_utils.pinset import install_command


def pinset_install_command(stack_python, lock, wheelhouse=None, index_url=None, extra_index_urls=None):
    """argv of pip install of the lock into the stack whose Python is stack_python (pinset.install_command)."""
    for name, value in (("the stack's Python", stack_python), ("lock", lock)):
        if not isinstance(value, str) or not value:
            raise AnsibleFilterError("pinset_install_command: %s must be a path, got %r" % (name, value))
    if extra_index_urls is not None and not isinstance(extra_index_urls, (list, tuple)):
        raise AnsibleFilterError(
            "pinset_install_command: extra_index_urls must be a list of URLs, got %r" % (extra_index_urls,)
        )
    return install_command(
        stack_python,
        lock,
        wheelhouse=wheelhouse or None,
        index_url=index_url or None,
        extra_index_urls=list(extra_index_urls or ()),
    )


class FilterModule:
    def filters(self):
        return {"pinset_install_command": pinset_install_command}
