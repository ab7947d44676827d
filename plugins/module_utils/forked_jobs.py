# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run several short Python programs in one interpreter that has paid the slow imports once.

Checking a release runs several programs in the service's stack (the pristine predicate matrix, the
matrix with the release, SGLang's parser on the service's flags), and each would pay the import of torch
first, most of what such a program costs (docs/decisions/forked-jobs.md). The runner imports the modules
named in ``preload`` once, then
forks one child per job: each child starts from that state, applies its own environment and
``sys.path``, runs its program as ``__main__`` with its own ``sys.argv``, and exits. A child changes
nothing the next one sees, as separate processes would not; what a child prints goes to files of its
own, so each job's output and exit status are read separately.

Preload only what every job would import first anyway and what a job cannot change by its environment
or path: torch (SGLang imports it before anything of its own). Never SGLang's own modules: a plugin
hooks them when it loads, and the pristine job must see no plugin.

RUNNER is the program, stdlib only, run as ``python -c RUNNER JOBS_JSON`` with the stack's Python.
"""

from __future__ import annotations

import json

RUNNER = r"""
import importlib, json, os, sys, tempfile, traceback

spec = json.loads(sys.argv[1])
for name in spec.get("preload", []):
    try:
        importlib.import_module(name)
    except ImportError:
        pass  # the job imports it itself, or fails on it, and says so in its own output

def run_job(job, out_fd, err_fd):
    sys.stdout.flush(); sys.stderr.flush()
    os.dup2(out_fd, 1); os.dup2(err_fd, 2)
    os.environ.update(job.get("env", {}))
    for name in job.get("unset", []):
        os.environ.pop(name, None)
    # Where PYTHONPATH entries go in a fresh interpreter: after the script's directory, before the stdlib.
    sys.path[1:1] = job.get("path", [])
    if job.get("script"):
        sys.path[0] = os.path.dirname(os.path.abspath(job["script"]))
    importlib.invalidate_caches()
    sys.argv = [job.get("script") or "-c"] + job.get("argv", [])
    rc = 0
    try:
        if job.get("script"):
            import runpy
            runpy.run_path(job["script"], run_name="__main__")
        else:
            exec(compile(job["code"], "<%s>" % job["name"], "exec"), {"__name__": "__main__"})
    except SystemExit as exc:
        if exc.code is None:
            rc = 0
        elif isinstance(exc.code, int):
            rc = exc.code
        else:
            print(exc.code, file=sys.stderr)
            rc = 1
    except BaseException:
        traceback.print_exc()
        rc = 1
    sys.stdout.flush(); sys.stderr.flush()
    os._exit(rc)

results = []
for job in spec["jobs"]:
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        pid = os.fork()
        if pid == 0:
            try:
                run_job(job, out.fileno(), err.fileno())
            finally:
                os._exit(70)
        _, status = os.waitpid(pid, 0)
        rc = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else (status >> 8)
        out.seek(0); err.seek(0)
        results.append({"name": job["name"], "rc": rc,
                        "stdout": out.read().decode("utf-8", "replace"),
                        "stderr": err.read().decode("utf-8", "replace")})
sys.stdout.write(json.dumps({"jobs": results}))
"""


def runner_command(python, jobs, preload=()):
    """The argv that runs ``jobs`` in ``python``: each job a dict with ``name`` and either ``code``
    (Python source) or ``script`` (a file run by path, its directory first on ``sys.path``), and
    optionally ``argv``, ``env`` (set), ``unset`` (names removed) and ``path`` (prepended as
    PYTHONPATH entries are)."""
    for job in jobs:
        if not job.get("name") or bool(job.get("code")) == bool(job.get("script")):
            raise ValueError("a job needs a name and exactly one of code or script: %r" % (job,))
    return [python, "-c", RUNNER, json.dumps({"preload": list(preload), "jobs": list(jobs)})]


def job_results(stdout):
    """The runner's answer: ``{name: {"rc", "stdout", "stderr"}}``. Raises ValueError when the runner
    itself printed no answer (it died before the end)."""
    try:
        answer = json.loads(stdout[stdout.rindex('{"jobs": ') :])
    except ValueError:
        raise ValueError("the job runner printed no answer: %r" % stdout[-500:]) from None
    return {job["name"]: job for job in answer["jobs"]}


def last_line(job):
    """The last non-empty line a job printed (its error, when it failed)."""
    lines = [line for line in (job.get("stderr") or job.get("stdout") or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def json_output(job):
    """The JSON object a job printed last (after any log lines). Raises ValueError when there is none."""
    text = job.get("stdout") or ""
    return json.loads(text[text.index("{") :])
