# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""One rollout at a time: per-host lock files on the controller, held for the life of a process.

A rollout (ansible-playbook, however it was triggered: CI job, pull timer, a person) locks every host
it targets before it changes anything. The locks are flock(2) locks held by a small holder process that
lives exactly as long as the process it watches (the ansible-playbook run): when the run ends, however
it ends (success, failure, Ctrl-C, kill -9), the holder exits and the kernel drops the locks. No stale
lock is ever left to clean up by hand.

Locks are taken in sorted order in one holder, so two rollouts over overlapping hosts can never each
hold a host the other waits for.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import time

# Exit status of a holder that gave up waiting (EX_TEMPFAIL, like flock --conflict-exit-code users pick).
BUSY_EXIT = 75


class LockError(Exception):
    """The locks could not be taken (not: another rollout holds them)."""


def lock_file_name(key):
    """A lock file name for a host key (its address or inventory name), safe on any filesystem."""
    if not key or not str(key).strip():
        raise LockError("a host key for the rollout lock is empty")
    return re.sub(r"[^A-Za-z0-9._-]", "_", str(key).strip()) + ".lock"


def lock_paths(lock_dir, keys):
    """Sorted, unique lock file paths for host keys (sorted: the order every rollout takes them in)."""
    return sorted({os.path.join(lock_dir, lock_file_name(key)) for key in keys})


def read_holder(path):
    """Who holds (or last held) a lock: the owner record the holder wrote, or None."""
    try:
        with open(path) as handle:
            text = handle.read().strip()
    except OSError:
        return None
    try:
        return json.loads(text) if text else None
    except ValueError:
        return {"unparsable": text[:200]}


def describe_holder(holder):
    """One line about a lock's holder, for a person deciding whether to wait."""
    if not holder:
        return "an unknown rollout"
    if "unparsable" in holder:
        return "an unknown rollout (%s)" % holder["unparsable"]
    parts = ["pid %s on %s" % (holder.get("pid", "?"), holder.get("controller", "?"))]
    for key in ("user", "trigger", "revision", "started"):
        if holder.get(key):
            parts.append("%s %s" % (key, holder[key]))
    return "rollout " + ", ".join(parts)


def _stat_fields(pid):
    """The fields of /proc/<pid>/stat after the command name ([] when there is none, e.g. off Linux)."""
    try:
        with open("/proc/%d/stat" % pid) as stat:
            return stat.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def process_start_time(pid):
    """The kernel's start time of a process (so a reused pid is not mistaken for it); '' off Linux."""
    fields = _stat_fields(pid)
    return fields[19] if len(fields) > 19 else ""


def process_alive(pid, start_time):
    """Whether the process that had start_time ('' = unknown) still runs: not gone, not a zombie, not reused."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    fields = _stat_fields(pid)
    if not fields:
        return start_time == ""
    # A zombie has ended; a different start time means the pid was reused.
    return fields[0] != "Z" and (start_time == "" or (len(fields) > 19 and fields[19] == start_time))


def _hold(paths, watch, watch_start, owner, timeout, poll):
    """The holder process: lock paths in order, say so on stdout, then stay while watch runs.

    Prints "wait <path>" when it starts waiting for a lock, then "acquired" or "busy <path>" (and
    exits BUSY_EXIT); once it holds every lock, it stays until the watched process is gone.
    """

    def say(line):
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    deadline = time.monotonic() + timeout
    fds = []
    for path in paths:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        waiting = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not process_alive(watch, watch_start):
                    return 1
                if time.monotonic() >= deadline:
                    say("busy " + path)
                    return BUSY_EXIT
                if not waiting:
                    say("wait " + path)
                    waiting = True
                time.sleep(poll)
        fds.append(fd)
    for fd in fds:
        os.ftruncate(fd, 0)
        os.pwrite(fd, owner.encode() + b"\n", 0)
    say("acquired")
    devnull = os.open(os.devnull, os.O_RDWR)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    while process_alive(watch, watch_start):
        time.sleep(poll)
    return 0


def _writable_dir(lock_dir):
    """Create the lock directory if needed; raise LockError when it cannot be written."""
    try:
        os.makedirs(lock_dir, exist_ok=True)
    except OSError as error:
        raise LockError(
            "cannot create the lock directory %s: %s (set DDTREE_LOCK_DIR to a writable one)" % (lock_dir, error)
        ) from None
    if not os.access(lock_dir, os.W_OK):
        raise LockError("the lock directory %s is not writable (set DDTREE_LOCK_DIR to a writable one)" % lock_dir)


def acquire(lock_dir, keys, owner, watch_pid, timeout, poll=1.0, on_wait=None):
    """Lock every host key for as long as watch_pid lives; wait up to timeout seconds for other rollouts.

    Returns {"acquired": True, "waited_s", "paths"} or, when another rollout still held a lock at the
    deadline, {"acquired": False, "waited_s", "path", "holder"}. on_wait(path, holder) is called once
    per lock the holder has to wait for. Raises LockError when the locks cannot be taken at all.
    """
    if timeout < 0:
        raise LockError("the rollout lock timeout is %r seconds; use 0 (refuse at once) or more (wait)" % timeout)
    paths = lock_paths(lock_dir, keys)
    if not paths:
        raise LockError("no hosts to lock")
    _writable_dir(lock_dir)
    start = time.monotonic()
    holder = subprocess.Popen(
        # The holder is this file run as a script (stdlib only), so it needs no import path.
        [
            sys.executable,
            os.path.abspath(__file__),
            json.dumps(paths),
            str(watch_pid),
            process_start_time(watch_pid),
            json.dumps(owner, sort_keys=True),
            str(timeout),
            str(poll),
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        close_fds=True,
    )
    for line in holder.stdout:
        verb, dummy, path = line.strip().partition(" ")
        if verb == "wait" and on_wait:
            on_wait(path, read_holder(path))
        elif verb == "acquired":
            holder.stdout.close()
            holder.stderr.close()
            return {"acquired": True, "waited_s": round(time.monotonic() - start, 1), "paths": paths}
        elif verb == "busy":
            holder.wait()
            return {
                "acquired": False,
                "waited_s": round(time.monotonic() - start, 1),
                "path": path,
                "holder": read_holder(path),
            }
    code = holder.wait()
    raise LockError(
        "the lock holder exited with status %s before taking the locks: %s"
        % (code, holder.stderr.read().strip()[-500:])
    )


if __name__ == "__main__":
    sys.exit(
        _hold(
            json.loads(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4], float(sys.argv[5]), float(sys.argv[6])
        )
    )
