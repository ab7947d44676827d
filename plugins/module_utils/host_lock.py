# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Exclusive flock(2) locks on a host, with a deadline and a message that names the holder.

Two processes on one host may build the same thing at once: two hosts' tasks sharing a directory, or a
module left running on the host by a controller that died (SSH keeps it going) while the next run
starts. The lock serialises them; the kernel drops it when its holder exits, however it exits, so a
killed builder never leaves it held.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time


class LockTimeout(Exception):
    """The lock stayed held by another process past the deadline."""

    def __init__(self, path, waited, holder):
        self.path, self.waited, self.holder = path, waited, holder
        who = "pid %s since %s" % (holder.get("pid", "?"), holder.get("since", "?")) if holder else "another process"
        super().__init__("%s is held by %s; waited %d s" % (path, who, waited))


def read_holder(path):
    """What the current holder wrote into the lock file: {pid, since}, or {} when unreadable."""
    try:
        with open(path) as handle:
            holder = json.load(handle)
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


@contextlib.contextmanager
def exclusive(path, timeout=None, poll=1.0, clock=time.monotonic, sleep=time.sleep):
    """Hold an exclusive lock on ``path`` (created if missing) for the with-block; yields seconds waited.

    ``timeout`` None waits as long as it takes; else ``LockTimeout`` after ``timeout`` seconds. The
    holder writes its pid and start time into the file, for the message of whoever waits next.
    """
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        start = clock()
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                waited = clock() - start
                if timeout is not None and waited >= timeout:
                    raise LockTimeout(path, waited, read_holder(path)) from None
                sleep(poll)
        os.ftruncate(fd, 0)
        os.pwrite(
            fd,
            json.dumps({"pid": os.getpid(), "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}).encode(),
            0,
        )
        yield clock() - start
    finally:
        os.close(fd)  # closing the last descriptor releases the lock
