# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run a server module as ``python -m`` would, with a secret flag read from standard input.

Usage (a unit's ExecStart; docs/services.md, "The API key"):

    <stack>/bin/python sglang_launch.py [--stdin-flag api-key] <module> [flags...]

With ``--stdin-flag NAME``, standard input holds the value of the server's flag ``--NAME``: the unit
connects it to the service's root-only key file (``StandardInput=file:/etc/sglang/<svc>.api-key``;
systemd opens it before it drops to the service's user). The launcher reads it (and rewinds it, for a
server that re-executes itself), and adds ``--NAME VALUE`` to the module's own argument list, inside
this process: the value is never in an argv (``/proc/<pid>/cmdline`` is readable
by every local user) nor in an environment. SGLang logs its whole ``server_args`` at start-up with the
API key in clear, so every text this process writes to stdout and stderr has the value replaced with
``<redacted>`` before it reaches the journal. Processes the server spawns write through streams of
their own; SGLang 0.5.23 prints ``server_args`` only in this one.

Standard library only, Python 3.9+: it runs on the service's stack, beside whichever release is
current, and must not depend on either.
"""

import atexit
import os
import re
import runpy
import sys

REDACTED = "<redacted>"
# A flag's name, without its leading "--".
FLAG_NAME = re.compile(r"^[a-z][a-z0-9-]*$")
USAGE = (
    "usage: sglang_launch.py [--stdin-flag NAME] <module> [flags...] "
    "(for example sglang.launch_server --model-path ...)"
)


class UsageError(Exception):
    """The launcher was called wrongly, or its secret is missing (exit 2, as argparse's for a bad flag)."""


def parse_args(argv):
    """(name of the flag whose value is on stdin or None, module, the module's flags)."""
    stdin_flag = None
    if argv[:1] == ["--stdin-flag"]:
        if len(argv) < 2 or not FLAG_NAME.match(argv[1]):
            raise UsageError("--stdin-flag needs a flag's name without its dashes, such as api-key. " + USAGE)
        stdin_flag, argv = argv[1], argv[2:]
    if not argv or argv[0].startswith("-"):
        raise UsageError(USAGE)
    return stdin_flag, argv[0], argv[1:]


def read_secret(stream, flag):
    """The secret on stream (one line; the end of line is not part of it)."""
    value = stream.read().rstrip("\r\n")
    if not value or "\n" in value:
        raise UsageError(
            "standard input holds %s for --%s; it must hold the value alone, on one line (the unit's "
            "StandardInput=file: names the service's key file)" % ("nothing" if not value else "several lines", flag)
        )
    return value


def rewind_stdin():
    """Back to the start of the key file: a server that re-executes itself with its own command line
    (``os.execve(sys.executable, sys.orig_argv)``: the lab runtime does, to set its environment) runs
    this launcher again, which must find the key again. A pipe cannot be rewound; nothing to do then."""
    try:
        os.lseek(0, 0, os.SEEK_SET)
    except OSError:
        pass


def longest_secret_prefix_at_end(text, secrets):
    """Length of the longest end of text that is a proper beginning of a secret (it may go on in the next write)."""
    longest = 0
    for secret in secrets:
        for size in range(min(len(secret) - 1, len(text)), longest, -1):
            if text.endswith(secret[:size]):
                longest = size
                break
    return longest


class RedactingStream:
    """A text stream that writes through to another with each secret replaced by <redacted>.

    Whole lines are written at once; a line's unfinished end is written on flush(), less any part of it
    that may be the beginning of a secret split across two writes (written with the next write, or at
    exit).
    """

    def __init__(self, stream, secrets):
        self._stream = stream
        # Longest first: a secret containing another is replaced whole.
        self._secrets = sorted(set(secrets), key=len, reverse=True)
        self._pending = ""

    def _redact(self, text):
        for secret in self._secrets:
            text = text.replace(secret, REDACTED)
        return text

    def write(self, text):
        self._pending += text
        cut = self._pending.rfind("\n") + 1
        if cut:
            self._stream.write(self._redact(self._pending[:cut]))
            self._pending = self._pending[cut:]
        return len(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self, final=False):
        text = self._redact(self._pending)
        hold = 0 if final else longest_secret_prefix_at_end(text, self._secrets)
        self._stream.write(text[: len(text) - hold])
        self._pending = text[len(text) - hold :]
        self._stream.flush()

    def close_flush(self):
        self.flush(final=True)

    def __getattr__(self, name):
        # fileno, isatty, encoding, reconfigure, buffer, ...: the underlying stream's.
        return getattr(self._stream, name)


def main(argv):
    stdin_flag, module, flags = parse_args(argv)
    if stdin_flag:
        secret = read_secret(sys.stdin, stdin_flag)
        rewind_stdin()
        flags = flags + ["--" + stdin_flag, secret]
        for name in ("stdout", "stderr"):
            stream = RedactingStream(getattr(sys, name), [secret])
            setattr(sys, name, stream)
            atexit.register(stream.close_flush)
    # Only the release and its stack are importable, as under `python -m` from a clean directory: not
    # the directory this file is in.
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    sys.argv = [module] + flags
    # Like `python -m`: the module runs as __main__, and its __spec__ lets multiprocessing's spawned
    # children import it again as __mp_main__.
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except UsageError as error:
        sys.stderr.write("sglang_launch.py: %s\n" % error)
        sys.exit(2)
