"""The rollout lock: per-host flock locks held for the life of a watched process."""

import subprocess
import sys

import pytest

from ansible_collections.ddtree.sglang.plugins.plugin_utils.rollout_lock import (
    LockError,
    acquire,
    describe_holder,
    lock_paths,
    read_holder,
)

OWNER = {
    "pid": 1,
    "controller": "runner-1",
    "user": "ci",
    "trigger": "github",
    "revision": "abc123",
    "hosts": ["ct200"],
}


@pytest.fixture
def playbook():
    """Stand-ins for ansible-playbook processes: start() -> Popen; all are killed at the end."""
    started = []

    def start():
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()
        proc.wait()


def test_lock_paths_are_sorted_unique_and_safe(tmp_path):
    assert lock_paths(str(tmp_path), ["ct200", "ct129", "ct200", "10.0.0.7", "host/../x"]) == [
        str(tmp_path / name) for name in ("10.0.0.7.lock", "ct129.lock", "ct200.lock", "host_.._x.lock")
    ]
    with pytest.raises(LockError, match="empty"):
        lock_paths(str(tmp_path), [" "])


def test_second_rollout_for_an_overlapping_host_is_refused_then_gets_it_when_the_first_ends(tmp_path, playbook):
    first, second = playbook(), playbook()
    got = acquire(str(tmp_path), ["ct200", "ct129"], dict(OWNER, pid=first.pid), first.pid, timeout=0, poll=0.05)
    assert got["acquired"] and len(got["paths"]) == 2
    assert read_holder(str(tmp_path / "ct200.lock"))["pid"] == first.pid

    refused = acquire(str(tmp_path), ["ct200"], dict(OWNER, pid=second.pid), second.pid, timeout=0, poll=0.05)
    assert refused["acquired"] is False and refused["holder"]["pid"] == first.pid
    assert "runner-1" in describe_holder(refused["holder"]) and "abc123" in describe_holder(refused["holder"])

    # The first run ends (here: killed): its holder notices and the kernel drops the locks.
    first.kill()
    first.wait()
    got = acquire(str(tmp_path), ["ct200"], dict(OWNER, pid=second.pid), second.pid, timeout=10, poll=0.05)
    assert got["acquired"] and read_holder(str(tmp_path / "ct200.lock"))["pid"] == second.pid


def test_a_waiting_rollout_is_told_who_it_waits_for_and_proceeds_when_the_lock_is_free(tmp_path, playbook):
    first, second = playbook(), playbook()
    assert acquire(str(tmp_path), ["ct129"], dict(OWNER, pid=first.pid), first.pid, timeout=0, poll=0.05)["acquired"]
    waits = []

    def first_ends_once_second_waits(path, holder):
        # Ended only once the second's holder has said it waits: a timer raced the holder's start-up on a busy machine.
        waits.append((path, holder["pid"]))
        first.kill()

    got = acquire(
        str(tmp_path),
        ["ct129", "ct200"],
        dict(OWNER, pid=second.pid),
        second.pid,
        timeout=30,
        poll=0.05,
        on_wait=first_ends_once_second_waits,
    )
    assert got["acquired"] and got["waited_s"] < 30
    assert waits == [(str(tmp_path / "ct129.lock"), first.pid)]


def test_disjoint_hosts_do_not_wait(tmp_path, playbook):
    first, second = playbook(), playbook()
    assert acquire(str(tmp_path), ["ct200"], OWNER, first.pid, timeout=0, poll=0.05)["acquired"]
    assert acquire(str(tmp_path), ["ct129"], OWNER, second.pid, timeout=0, poll=0.05)["acquired"]


def test_a_refused_rollout_keeps_no_lock(tmp_path, playbook):
    """Refused on ct200 after taking ct129 (sorted order): ct129 is free again at once."""
    first, second, third = playbook(), playbook(), playbook()
    assert acquire(str(tmp_path), ["ct200"], OWNER, first.pid, timeout=0, poll=0.05)["acquired"]
    assert not acquire(str(tmp_path), ["ct129", "ct200"], OWNER, second.pid, timeout=0, poll=0.05)["acquired"]
    assert acquire(str(tmp_path), ["ct129"], OWNER, third.pid, timeout=0, poll=0.05)["acquired"]


def test_bad_input_names_the_value(tmp_path, playbook):
    with pytest.raises(LockError, match="-1"):
        acquire(str(tmp_path), ["ct200"], OWNER, playbook().pid, timeout=-1)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(LockError, match="DDTREE_LOCK_DIR"):
        acquire(str(blocker / "locks"), ["ct200"], OWNER, playbook().pid, timeout=0)


def test_holder_of_an_unreadable_record_is_still_described(tmp_path):
    (tmp_path / "x.lock").write_text("garbage")
    assert describe_holder(read_holder(str(tmp_path / "x.lock"))) == "an unknown rollout (garbage)"
    assert describe_holder(None) == "an unknown rollout"
