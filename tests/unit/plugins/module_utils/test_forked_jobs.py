"""The forked-job runner: one interpreter, the slow imports paid once, each job as isolated as a process."""

import subprocess
import sys

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils import forked_jobs


def run(jobs, preload=(), env=None):
    argv = forked_jobs.runner_command(sys.executable, jobs, preload)
    done = subprocess.run(argv, capture_output=True, text=True, env=env, check=True)
    return forked_jobs.job_results(done.stdout)


def test_each_job_has_its_own_environment_path_and_argv(tmp_path):
    (tmp_path / "only_for_a.py").write_text("WHO = 'a'\n")
    results = run(
        [
            dict(
                name="a",
                code="import os, sys, only_for_a; print(os.environ['MARK'], only_for_a.WHO, sys.argv[1:])",
                env={"MARK": "set-for-a"},
                path=[str(tmp_path)],
                argv=["--x", "1"],
            ),
            # What job a changed is gone: a separate process would not see it either.
            dict(name="b", code="import os, sys\nprint(os.environ.get('MARK'), str(sys.argv[1:]))\nimport only_for_a"),
        ]
    )
    assert results["a"] == {"name": "a", "rc": 0, "stdout": "set-for-a a ['--x', '1']\n", "stderr": ""}
    assert results["b"]["stdout"] == "None []\n"
    assert (
        results["b"]["rc"] == 1
        and forked_jobs.last_line(results["b"]) == "ModuleNotFoundError: No module named 'only_for_a'"
    )


def test_exit_statuses_and_output_are_the_jobs_own():
    results = run(
        [
            dict(name="argparse-error", code="import sys; print('usage: x', file=sys.stderr); sys.exit(2)"),
            dict(name="raises", code="raise RuntimeError('boom')"),
            dict(name="exit-message", code="raise SystemExit('bad flag --nope')"),
            dict(name="json-after-logs", code="print('a log line'); print('{\"ok\": true}')"),
        ]
    )
    assert results["argparse-error"]["rc"] == 2 and forked_jobs.last_line(results["argparse-error"]) == "usage: x"
    assert results["raises"]["rc"] == 1 and "Traceback" in results["raises"]["stderr"]
    assert forked_jobs.last_line(results["raises"]) == "RuntimeError: boom"
    assert results["exit-message"]["rc"] == 1 and forked_jobs.last_line(results["exit-message"]) == "bad flag --nope"
    assert forked_jobs.json_output(results["json-after-logs"]) == {"ok": True}


def test_preloaded_module_is_imported_once_for_every_job(tmp_path):
    counter = tmp_path / "imports.log"
    (tmp_path / "slow_import.py").write_text("open(%r, 'a').write('imported\\n')\n" % str(counter))
    jobs = [dict(name=str(n), code="import slow_import") for n in range(3)]
    env = {"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"}
    assert all(
        result["rc"] == 0 for result in run(jobs, preload=["slow_import", "not_installed_anywhere"], env=env).values()
    )
    assert counter.read_text() == "imported\n"
    counter.unlink()
    run(jobs, env=env)
    assert counter.read_text() == "imported\n" * 3


def test_script_runs_by_path_with_its_directory_first(tmp_path):
    (tmp_path / "helper_beside.py").write_text("VALUE = 7\n")
    script = tmp_path / "tool.py"
    script.write_text("import sys, helper_beside\nprint(helper_beside.VALUE, sys.argv[1:])\n")
    results = run([dict(name="tool", script=str(script), argv=["--json"])])
    assert results["tool"]["stdout"] == "7 ['--json']\n"


@pytest.mark.parametrize("job", [dict(code="pass"), dict(name="x"), dict(name="x", code="pass", script="/a.py")])
def test_bad_jobs_are_refused(job):
    with pytest.raises(ValueError, match="exactly one of code or script"):
        forked_jobs.runner_command("python", [job])


def test_no_answer_is_an_error():
    with pytest.raises(ValueError, match="printed no answer"):
        forked_jobs.job_results("Segmentation fault\n")
