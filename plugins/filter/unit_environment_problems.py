# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""What a mapping of environment variables cannot be as systemd ``Environment="NAME=VALUE"`` lines of a unit
(the names and values rules are the services' environment's, module_utils/services.py, plus what a quoted
unit line reads differently: a double quote, a backslash, a lone % specifier)."""

from __future__ import annotations

import re

from ansible_collections.ddtree.sglang.plugins.module_utils.services import (
    ENVIRONMENT_NAME,
    environment_value_problem,
)

_NAME = re.compile("^%s$" % ENVIRONMENT_NAME)


def _unit_value_problem(value) -> str | None:
    problem = environment_value_problem(value)
    if problem is not None:
        return problem
    if isinstance(value, (dict, list)) or value is None:
        return "%r is not a string or a number" % (value,)
    text = str(value)
    if '"' in text or "\\" in text:
        return "%r holds a double quote or a backslash, which the quoted Environment= line reads as its own" % text
    if "%" in text.replace("%%", ""):
        return "%r holds a %%, which systemd expands as a specifier; write %%%% for a literal %%" % text
    return None


def unit_environment_problems(environment, variable="environment"):
    """One message per variable of ``environment`` that a unit's Environment= line cannot carry as written."""
    if not isinstance(environment, dict):
        # A plain error (Ansible reports a filter's exception with the task): importing ansible.errors here would
        # load the controller's warning handling into every test process that imports this filter.
        raise TypeError("%s must be a mapping of variable names to values, got %r" % (variable, environment))
    problems = []
    for name, value in sorted(environment.items(), key=lambda item: str(item[0])):
        if not isinstance(name, str) or not _NAME.match(name):
            problems.append(
                "%s: %r is not a variable name (letters, digits and _, not starting with a digit)" % (variable, name)
            )
            continue
        problem = _unit_value_problem(value)
        if problem is not None:
            problems.append("%s.%s: %s" % (variable, name, problem))
    return problems


class FilterModule:
    def filters(self):
        return {"unit_environment_problems": unit_environment_problems}
