"""Lab hosts only: the lab's `ansible_python_interpreter` (/usr/local/libexec/ddtree-lab/python, which
lab/image/build writes with the shebang `#!/usr/bin/python3 -IS`: no site, no environment).

Hands `python3 [script [args]]` (a script on standard input when none is named: Ansible's pipelining) to
the host's module zygote (module_zygote.py says why), with this process's environment, working directory,
umask, resource limits and standard streams, and exits as the run did. Anything else (another user, an
interpreter option, no zygote running) is `/usr/bin/python3` itself, unchanged.
"""

# Only built-in modules (no socket, signal or json: their enums and regular expressions would double this
# process's start-up, which every module run pays).
import _signal
import _socket
import marshal
import os
import resource
import sys

PYTHON = "/usr/bin/python3"
SOCKET = "/run/ddtree-lab/module-zygote.sock"


def fresh_interpreter():
    os.execv(PYTHON, [PYTHON] + sys.argv[1:])


class Replies:
    """The zygote's replies, a line each: `pid N`, then `exit N` or `signal N`; or `fallback <why>`."""

    def __init__(self, zygote):
        self.zygote = zygote
        self.received = b""

    def next(self):
        while b"\n" not in self.received:
            more = self.zygote.recv(4096)
            if not more:
                return None
            self.received += more
        line, self.received = self.received.split(b"\n", 1)
        return line.decode().split(" ", 1)


def main():
    argv = sys.argv[1:]
    if os.getuid() != 0 or (argv and argv[0].startswith("-")):
        fresh_interpreter()
    zygote = _socket.socket(_socket.AF_UNIX, _socket.SOCK_STREAM)
    try:
        zygote.connect(os.environ.get("DDTREE_LAB_MODULE_ZYGOTE", SOCKET))
    except OSError:
        fresh_interpreter()
    request = marshal.dumps(
        {
            "argv": argv,
            "cwd": os.getcwd(),
            "environment": dict(os.environ),
            "umask": os.umask(os.umask(0o022)),
            "rlimits": {
                name: resource.getrlimit(getattr(resource, name))
                for name in dir(resource)
                if name.startswith("RLIMIT_")
            },
        }
    )
    streams = b"".join(fd.to_bytes(4, sys.byteorder) for fd in (0, 1, 2))  # C ints, as SCM_RIGHTS wants them
    zygote.sendmsg([len(request).to_bytes(4, "big") + request], [(_socket.SOL_SOCKET, _socket.SCM_RIGHTS, streams)])
    replies = Replies(zygote)
    reply = replies.next()
    if reply is None or reply[0] != "pid":
        zygote.close()
        fresh_interpreter()
    pid = int(reply[1])

    def forward(signum, _frame):
        os.kill(pid, signum)

    for signum in (_signal.SIGTERM, _signal.SIGINT, _signal.SIGHUP):
        _signal.signal(signum, forward)
    status = replies.next()
    if status is None:
        os.write(2, b"module_zygote_client: the zygote went away before run %d ended\n" % pid)
        os._exit(255)
    if status[0] == "signal":
        signum = int(status[1])
        _signal.signal(signum, _signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        os._exit(128 + signum)
    os._exit(int(status[1]))


main()
