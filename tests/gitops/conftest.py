"""What the lab tests of tests/gitops share: running a command, copying this checkout (the fleet
repository of test_gitops.py, the varied tree of test_interrupted.py), and killing a run the way a
cancelled CI job or a dead controller ends it."""

import os
import shutil
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARTIFACTS = Path(os.environ.get("DDTREE_TEST_ARTIFACTS") or REPO / ".cache" / "gitops-artifacts")
# The pull timer's guard (its unit's ExecStartPre and ExecStopPost), run here as the rollout node would.
PULL_GUARD = REPO / "roles" / "rollout_pull" / "files" / "ddtree-rollout-pull-guard"


def run(command, env, cwd=REPO, check=True, timeout=1800, new_session=False):
    proc = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        text=True,
        capture_output=True,
        timeout=timeout,
        check=False,
        start_new_session=new_session,
    )
    if check and proc.returncode != 0:
        raise AssertionError(
            "%s exited %d\n--- stdout (tail)\n%s\n--- stderr (tail)\n%s"
            % (" ".join(map(str, command)), proc.returncode, proc.stdout[-6000:], proc.stderr[-3000:])
        )
    return proc


def copy_checkout(target_root, env):
    """This checkout's files as Git sees them (tracked and new, not ignored; links kept as links) under
    target_root: what a commit of the working tree would hold."""
    files = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], env).stdout.split("\0")
    for name in filter(None, files):
        source = REPO / name
        if not source.exists() and not source.is_symlink():
            continue  # deleted in this checkout, not yet committed
        target = target_root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), target)
        else:
            shutil.copy2(source, target)


def on_lab_host(env, host, *command, check=True, stdin=None):
    """A command on a lab host (its container); stdin, when given, is how a secret reaches it (never argv)."""
    argv = ["podman", "exec", *(["-i"] if stdin is not None else []), "%s-%s" % (env["DDTREE_LAB_ID"], host), *command]
    proc = subprocess.run(argv, env=env, input=stdin, text=True, capture_output=True, timeout=600, check=False)
    if check and proc.returncode != 0:
        raise AssertionError("%s exited %d: %s" % (argv[:6], proc.returncode, proc.stderr[-3000:]))
    return proc.stdout.strip()


def killed_at_task(env, task, marker, after_s=0):
    """The environment of a playbook run that SIGKILLs its own process group when the task whose name
    starts with `task` begins, or `after_s` seconds into it (callback_plugins/kill_at_task.py), after
    writing `marker`. Run it with new_session=True, so that nothing but the run dies."""
    plugins = [str(Path(__file__).parent / "callback_plugins")] + list(
        filter(None, [env.get("ANSIBLE_CALLBACK_PLUGINS")])
    )
    return dict(
        env,
        ANSIBLE_CALLBACK_PLUGINS=":".join(plugins),
        ANSIBLE_CALLBACKS_ENABLED="ddtree.sglang.rollout_summary,kill_at_task",
        DDTREE_KILL_AT_TASK=task,
        DDTREE_KILL_AFTER_S=str(after_s),
        DDTREE_KILL_MARKER=str(marker),
    )
