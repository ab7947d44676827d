#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

DOCUMENTATION = r"""
---
module: spec_verify
short_description: Check SGLang's speculative algorithms with an overlay release active, and dry-parse a service's flags
version_added: 0.1.0
description:
  - In a stack, computes SGLang's predicate matrix twice with the overlay's
    C(sglang_overlay.predicates) - once pristine (the release's site directory not on C(PYTHONPATH),
    plugins not loaded) and once with the release on C(PYTHONPATH) and plugins loaded as SGLang loads
    them.
  - Fails, naming the row, when a built-in algorithm's predicates or behaviour differ between the two,
    or when the plugin's algorithm (C(DDTREE)) is not DFlash-family (C(is_dflash) and
    C(is_dflash_family) true, every other predicate as C(DFLASH)'s) - the check that would have caught
    the C(!!!!!!!!) incident.
  - Dry-parses the service's flags with SGLang's own parser with the release active (a bad flag fails,
    naming it) and resolves its speculative algorithm.
  - With O(flags_release), parses the flags with that release's C(site/) instead (the release the
    service runs - a pinned one, or the base release of a service that does not load the overlay); with
    O(flags_overlay=false) it also fails when an SGLang plugin of the overlay is discoverable there.
  - Writes nothing (C(PYTHONDONTWRITEBYTECODE=1)).
  - Lists the hybrid (recurrent + attention) target layouts the release knows, each with whether
    C(DDTREE) verifies a tree on it and what of that is proven, or why it refuses it (RV(hybrid_layouts)).
  - Runs the checks in one process of the stack's Python that imports torch once and forks a child per
    check, each with its own environment and path as separate processes would have; about half the CPU
    time of separate processes.
  - With O(state_root), records a pass on the host (C(<state_root>/_checks/spec_verify/<key>.json),
    written whole) and, on a later run with the same key, returns the recorded result without starting
    the stack's Python (RV(recorded) true). The key is a digest of every option, the module's code and
    fingerprints of the stack (completion marker, site-packages listing, each distribution's C(RECORD),
    the interpreter) and of both releases (manifest, size and mtime of every file under C(site/)); a
    changed or tampered file is a new key and is checked again. A failed check, a stack without its
    marker or a release without its manifest records nothing; check mode reads records but writes none.
author:
  - ddtree.sglang maintainers (@ddtree-sglang)
options:
  stack:
    description: The stack (venv) the service runs in.
    type: path
    required: true
  release:
    description: The release directory (its C(site/) goes on C(PYTHONPATH)).
    type: path
    required: true
  plugin_algorithm:
    description: The algorithm the release adds, checked to be DFlash-family.
    type: str
    default: DDTREE
  flags:
    description: The service's C(launch_server) flags, to dry-parse. Empty skips the dry parse.
    type: list
    elements: str
    default: []
  environment:
    description: Extra environment for the dry parse (the service's, for example C(SGLANG_DDTREE_BUDGET)).
    type: dict
    default: {}
  flags_release:
    description: The release whose C(site/) the flags are parsed with (the one the service runs); unset, O(release).
    type: path
  flags_overlay:
    description:
      - Whether the service loads the overlay. C(false) (a NEXTN service on the base release) fails the
        check when a plugin from the overlay's package is discoverable with O(flags_release).
    type: bool
    default: true
  state_root:
    description:
      - Where passes are recorded (C(<state_root>/_checks/spec_verify/)), for example the services' state
        root C(/var/lib/sglang). Unset, nothing is recorded and every run checks.
    type: path
extends_documentation_fragment:
  - ddtree.sglang.attributes.read_only
"""

EXAMPLES = r"""
- name: Check the predicate matrix and the coder service's flags with the new release
  ddtree.sglang.spec_verify:
    stack: /opt/sglang/stacks/3f2a9c1d0b7e
    release: /opt/sglang/releases/9c1d0b7e3f2a
    flags: [--model-path, /models/coder, --speculative-algorithm, DDTREE,
            --speculative-draft-model-path, /models/coder-dflash]
    state_root: /var/lib/sglang
"""

RETURN = r"""
matrix:
  description: The matrix with the release active, as lines for people to read.
  returned: when both matrices were computed
  type: list
  elements: str
with_release:
  description: The full matrix with the release active.
  returned: when computed
  type: dict
builtin_differences:
  description: Built-in algorithms' predicates that the release changes (must be empty).
  returned: when both matrices were computed
  type: list
  elements: str
plugin_problems:
  description: Why the plugin algorithm is not DFlash-family (must be empty).
  returned: when both matrices were computed
  type: list
  elements: str
hybrid_layouts:
  description:
    - The hybrid target layouts the release knows, one line each - C(tree verify) and what is proven of
      it, or C(refused) and why; one line saying so for a release that does not list them.
  returned: when both matrices were computed
  type: list
  elements: str
parsed:
  description:
    - What SGLang's parser made of the flags (model path, port, algorithm and what it resolves to), and
      C(plugins), the SGLang plugins discoverable there (C(name), C(value)).
  returned: when I(flags) were given and parsed
  type: dict
recorded:
  description: Whether the result is a recorded pass (nothing was run); false when the check ran.
  returned: always
  type: bool
recorded_at:
  description: When the recorded pass was checked (UTC).
  returned: when RV(recorded) is true
  type: str
record:
  description: The record's path on the host (read, or written by this pass).
  returned: when O(state_root) is set and the stack and releases are complete
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.ddtree.sglang.plugins.module_utils import check_records
from ansible_collections.ddtree.sglang.plugins.module_utils.forked_jobs import (
    job_results,
    json_output,
    last_line,
    runner_command,
)
from ansible_collections.ddtree.sglang.plugins.module_utils.spec_matrix import (
    FLAGS_PROBE,
    HYBRID_LAYOUTS_PROBE,
    PREDICATES_WITH_PLUGINS,
    PRELOAD,
    builtin_differences,
    dflash_family_problems,
    hybrid_layout_lines,
    matrix_lines,
    overlay_plugins,
)

CHECK = "spec_verify"
# The code a recorded pass was checked with: this module and what it runs in the stack.
CODE = (
    "ansible_collections.ddtree.sglang.plugins.modules.spec_verify",
    "ansible_collections.ddtree.sglang.plugins.module_utils.spec_matrix",
    "ansible_collections.ddtree.sglang.plugins.module_utils.forked_jobs",
    "ansible_collections.ddtree.sglang.plugins.module_utils.check_records",
)


def record_slot(params):
    """Where a pass with these options, stack and releases is recorded (check_records.find_record)."""
    options = {name: value for name, value in params.items() if name != "state_root"}
    releases = sorted({params["release"], params["flags_release"] or params["release"]})
    fingerprints = {
        "stack": check_records.stack_fingerprint(params["stack"]),
        "releases": {release: check_records.release_fingerprint(release) for release in releases},
    }
    complete = bool(fingerprints["stack"]["marker"]) and all(
        print_["manifest"] for print_ in fingerprints["releases"].values()
    )
    return check_records.find_record(
        params["state_root"], CHECK, CODE, dict(options, fingerprints=fingerprints), complete
    )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            stack=dict(type="path", required=True),
            release=dict(type="path", required=True),
            plugin_algorithm=dict(type="str", default="DDTREE"),
            flags=dict(type="list", elements="str", default=[]),
            environment=dict(type="dict", default={}),
            flags_release=dict(type="path"),
            flags_overlay=dict(type="bool", default=True),
            state_root=dict(type="path"),
        ),
        supports_check_mode=True,
    )
    params = module.params
    slot = record_slot(params)
    if slot and slot["record"]:
        module.exit_json(**check_records.recorded_result(slot))
    jobs = _jobs(params)
    answers = _run(module, jobs)
    pristine, with_release = _output(module, answers, jobs[0]), _output(module, answers, jobs[1])
    result = dict(
        changed=False,
        matrix=matrix_lines(pristine, with_release),
        with_release=with_release,
        builtin_differences=builtin_differences(pristine, with_release),
        plugin_problems=dflash_family_problems(with_release, params["plugin_algorithm"]),
        hybrid_layouts=hybrid_layout_lines(_output(module, answers, jobs[2])),
    )
    if result["builtin_differences"] or result["plugin_problems"]:
        module.fail_json(
            msg="the release changes SGLang's speculative algorithms: %s"
            % "; ".join(result["builtin_differences"] + result["plugin_problems"]),
            **result,
        )
    if params["flags"]:
        _check_flags(module, result, _output(module, answers, jobs[3]))
    module.exit_json(recorded=False, **check_records.record_pass(slot, CHECK, result, module.check_mode))


def _jobs(params: dict) -> list:
    """The programs to run in the stack's Python: the predicate matrix pristine and with the release, the
    release's hybrid layouts, and SGLang's parser on the service's flags (when there are flags)."""
    site = os.path.join(params["release"], "site")
    jobs = [
        # Pristine: the predicates file run by path, so nothing of the release is importable or discoverable.
        dict(
            name="the pristine predicate matrix",
            script=os.path.join(site, "sglang_overlay", "predicates.py"),
            argv=["--json", "--no-plugins"],
        ),
        dict(
            name="the predicate matrix with the release",
            code=PREDICATES_WITH_PLUGINS,
            argv=["--json"],
            path=[site],
            env={"PYTHONPATH": site},
        ),
        dict(
            name="the release's hybrid layouts",
            code=HYBRID_LAYOUTS_PROBE,
            argv=[],
            path=[site],
            env={"PYTHONPATH": site},
        ),
    ]
    if params["flags"]:
        # The flags are parsed with the release the service runs (a pinned one, or a base release).
        flags_site = os.path.join(params["flags_release"] or params["release"], "site")
        env = dict({"PYTHONPATH": flags_site}, **{key: str(value) for key, value in params["environment"].items()})
        jobs.append(
            dict(
                name="SGLang's parser on the service's flags",
                code=FLAGS_PROBE,
                argv=params["flags"],
                path=[flags_site],
                env=env,
            )
        )
    return jobs


def _run(module, jobs: list) -> dict:
    """Run the jobs in one process of the stack's Python, torch imported once, a forked child per program
    (module_utils/forked_jobs.py). The process runs without the release on its path; only the jobs that need
    it get it. -> {job name: its answer}."""
    python = os.path.join(module.params["stack"], "bin", "python")
    quiet = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONNOUSERSITE": "1"}
    rc, stdout, stderr = module.run_command(
        runner_command(python, jobs, preload=PRELOAD), environ_update=dict(quiet, PYTHONPATH="")
    )
    try:
        return job_results(stdout)
    except ValueError as exc:
        module.fail_json(
            msg="the stack's Python could not run the checks (exit %d): %s" % (rc, exc),
            rc=rc,
            stderr_lines=(stderr or "").splitlines()[-40:],
        )


def _output(module, answers: dict, job: dict):
    """A job's JSON output; the module fails with its exit status and errors when it has none."""
    answer = answers[job["name"]]
    if answer["rc"] != 0:
        module.fail_json(
            msg="%s failed (exit %d): %s" % (job["name"], answer["rc"], last_line(answer)),
            rc=answer["rc"],
            stdout=answer["stdout"],
            stderr_lines=answer["stderr"].splitlines()[-40:],
        )
    try:
        return json_output(answer)
    except ValueError:
        module.fail_json(msg="%s printed no JSON: %r" % (job["name"], answer["stdout"][-500:]))


def _check_flags(module, result: dict, parsed: dict):
    """The service's flags as SGLang parsed them: no overlay where it must not load, an algorithm that resolves."""
    params = module.params
    result["parsed"] = parsed
    leaked = overlay_plugins(parsed.get("plugins") or [])
    if not params["flags_overlay"] and leaked:
        module.fail_json(
            msg="the service must not load the overlay, but its release %s makes SGLang discover the overlay's "
            "plugin %s" % (params["flags_release"] or params["release"], ", ".join(leaked)),
            **result,
        )
    if parsed.get("error"):
        module.fail_json(
            msg="--speculative-algorithm %s does not resolve with the release: %s"
            % (parsed["algorithm"], parsed["error"]),
            **result,
        )


if __name__ == "__main__":
    main()
