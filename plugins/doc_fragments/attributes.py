# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """Attributes shared by the collection's modules."""

    # Modules that only read the host: they run the same in check mode and have nothing to diff.
    READ_ONLY = r"""
attributes:
  check_mode:
    support: full
    description: Only reads; runs the same in check mode.
  diff_mode:
    support: none
    description: Changes nothing, so there is nothing to diff.
"""

    # Modules that set facts.
    FACTS = r"""
attributes:
  facts:
    support: full
    description: Sets facts under C(ansible_facts).
"""
