# -*- coding: utf-8 -*-
# Copyright: ddtree.sglang contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""Run a server module as ``python -m`` would, with its secret flags from systemd credentials.

Usage (a unit's ExecStart; docs/services.md, "The API key"):

    <stack>/bin/python sglang_launch.py <module> [flags...]

Each credential systemd hands the unit (``LoadCredential=NAME:/path``, in ``$CREDENTIALS_DIRECTORY``)
whose NAME is a flag's name (``api-key``) becomes that flag (``--api-key VALUE``) in the module's own
argument list, inside this process: the value is never in an argv (``/proc/<pid>/cmdline`` is readable
by every local user) nor in an environment. SGLang logs its whole ``server_args`` at start-up with the
API key in clear, so every text this process writes to stdout and stderr has each value replaced with
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
# A credential's name is a flag's name: "api-key" -> "--api-key".
FLAG_NAME = re.compile(r"^[a-z][a-z0-9-]*$")


class UsageError(Exception):
    """The launcher was called wrongly (exit 2, as argparse does for a bad flag)."""


def credential_flags(directory):
    """The flags and the secret values from a credentials directory (sorted by name; none if unset)."""
    if not directory:
        return [], []
    flags, values = [], []
    for name in sorted(os.listdir(directory)):
        if not FLAG_NAME.match(name):
            raise UsageError("credential %r in %s is not a flag's name (lower-case letters, digits and '-', "
                             "as in LoadCredential=api-key:/etc/sglang/<service>.api-key)" % (name, directory))
        with open(os.path.join(directory, name), encoding="utf-8") as handle:
            value = handle.read().rstrip("\r\n")
        if not value:
            raise UsageError("credential %r in %s is empty: write the secret into the file LoadCredential names"
                             % (name, directory))
        flags += ["--" + name, value]
        values.append(value)
    return flags, values


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
        self._stream.write(text[:len(text) - hold])
        self._pending = text[len(text) - hold:]
        self._stream.flush()

    def close_flush(self):
        self.flush(final=True)

    def __getattr__(self, name):
        # fileno, isatty, encoding, reconfigure, buffer, ...: the underlying stream's.
        return getattr(self._stream, name)


def main(argv):
    if not argv or argv[0].startswith("-"):
        raise UsageError("usage: sglang_launch.py <module> [flags...] (for example sglang.launch_server --model-path ...)")
    module, flags = argv[0], argv[1:]
    secret_flags, secrets = credential_flags(os.environ.get("CREDENTIALS_DIRECTORY"))
    if secrets:
        for name in ("stdout", "stderr"):
            stream = RedactingStream(getattr(sys, name), secrets)
            setattr(sys, name, stream)
            atexit.register(stream.close_flush)
    # Only the release and its stack are importable, as under `python -m` from a clean directory: not
    # the directory this file is in.
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        del sys.path[0]
    sys.argv = [module] + flags + secret_flags
    # Like `python -m`: the module runs as __main__, and its __spec__ lets multiprocessing's spawned
    # children import it again as __mp_main__.
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except UsageError as error:
        sys.stderr.write("sglang_launch.py: %s\n" % error)
        sys.exit(2)
