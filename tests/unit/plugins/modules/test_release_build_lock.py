"""The release module's build lock: a second build of one release waits for the first, never undoes it.

A base release (overlay=false, no wheels) is built for real here: a stack whose python is this
interpreter is all it needs.
"""

import os
import sys
import threading
import time

from conftest import run_module

from ansible_collections.ddtree.sglang.plugins.module_utils import host_lock
from ansible_collections.ddtree.sglang.plugins.module_utils.release import MANIFEST
from ansible_collections.ddtree.sglang.plugins.modules import release


def release_args(tmp_path, **extra):
    stack = tmp_path / "stacks" / "s1"
    (stack / "bin").mkdir(parents=True, exist_ok=True)
    if not (stack / "bin" / "python").exists():
        os.symlink(sys.executable, stack / "bin" / "python")
    return dict({"root": str(tmp_path / "releases"), "overlay": False, "stack": str(stack), "stack_id": "s1"}, **extra)


def test_a_build_held_by_another_process_fails_naming_it_and_leaves_its_files(tmp_path, capsys):
    args = release_args(tmp_path)
    code, built = run_module(release, args, capsys)
    assert code == 0 and built["changed"]
    path = built["release_dir"]
    os.remove(os.path.join(path, MANIFEST))  # as the other builder sees it before its manifest
    with host_lock.exclusive(os.path.join(args["root"], ".%s.lock" % built["release_id"])):
        code, result = run_module(release, dict(args, lock_timeout=0), capsys)
    assert code == 1 and result["problems"] == ["build in progress"]
    assert "being built by another process on this host" in result["msg"] and "pid %d" % os.getpid() in result["msg"]
    assert result["holder"]["pid"] == os.getpid()
    assert os.path.isdir(os.path.join(path, "site"))  # the other build's files are untouched
    code, result = run_module(release, args, capsys)  # the holder gone: the partial release is rebuilt
    assert code == 0 and result["changed"] and result["rebuilt_partial"]


def test_a_build_that_waited_finds_the_release_the_other_one_finished(tmp_path, capsys):
    args = release_args(tmp_path)
    code, built = run_module(release, args, capsys)
    manifest = os.path.join(built["release_dir"], MANIFEST)
    with open(manifest) as handle:
        content = handle.read()
    os.chmod(built["release_dir"], 0o755)
    os.remove(manifest)
    held, done = threading.Event(), threading.Event()

    def other_builder():
        with host_lock.exclusive(os.path.join(args["root"], ".%s.lock" % built["release_id"])):
            held.set()
            time.sleep(1.5)
            with open(manifest, "w") as handle:  # it finishes its build
                handle.write(content)
        done.set()

    thread = threading.Thread(target=other_builder)
    thread.start()
    held.wait(5)
    code, result = run_module(release, dict(args, lock_timeout=30), capsys)
    thread.join()
    assert done.is_set()
    assert code == 0 and not result["changed"] and not result["rebuilt_partial"], result


def test_the_lock_times_out_with_the_holders_pid_and_frees_when_its_holder_exits(tmp_path):
    path = str(tmp_path / "x.lock")
    clock = iter(range(100)).__next__
    with host_lock.exclusive(path):
        try:
            with host_lock.exclusive(path, timeout=3, clock=clock, sleep=lambda s: None):
                raise AssertionError("a second holder got the lock")
        except host_lock.LockTimeout as error:
            assert error.holder["pid"] == os.getpid() and error.waited >= 3
    with host_lock.exclusive(path, timeout=0) as waited:  # released with its descriptor
        assert waited == 0 or waited < 1
