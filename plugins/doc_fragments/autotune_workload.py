# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations


class ModuleDocFragment:
    """The measuring's options (plugins/module_utils/autotune_measure.py, WORKLOAD_ARGUMENT_SPEC), shared by
    service_autotune_measure and service_autotune_trial."""

    DOCUMENTATION = r"""
options:
  max_tokens:
    description: Completion tokens per request (greedy). Part of the tuning key (the workload).
    type: int
    default: 128
  warmup:
    description: Requests sent first and not measured (a fresh server's first requests pay for lazy initialisation).
    type: int
    default: 1
  request_timeout:
    description: Seconds one request may take.
    type: float
    default: 300
"""
