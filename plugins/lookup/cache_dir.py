# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
name: cache_dir
short_description: The controller's cache folder for ddtree.sglang, or paths under it
version_added: 0.1.0
description:
  - C($DDTREE_CACHE) when set, else C($XDG_CACHE_HOME/ddtree-sglang), else C(~/.cache/ddtree-sglang), on the
    controller. Each term is a path under it; without terms, the folder itself.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  _terms:
    description: Paths under the cache folder.
    type: list
    elements: str
    required: false
"""

EXAMPLES = r"""
- name: Where the overlay wheels are cached
  ansible.builtin.debug:
    msg: "{{ lookup('ddtree.sglang.cache_dir', 'overlay') }}"
"""

RETURN = r"""
_raw:
  description: The cache folder, or one path under it per term.
  type: list
  elements: str
"""

from ansible.plugins.lookup import LookupBase

from ansible_collections.ddtree.sglang.plugins.plugin_utils.cache import cache_dir


class LookupModule(LookupBase):
    def run(self, terms, variables=None, **kwargs):
        self.set_options(var_options=variables, direct=kwargs)
        return [cache_dir(term) for term in terms] if terms else [cache_dir()]
