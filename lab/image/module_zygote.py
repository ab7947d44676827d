"""Lab hosts only: run Ansible's module payloads in forks of a Python that has ansible-core imported.

A module run on a lab host costs about 0.22 CPU-seconds, and nearly all of it is the interpreter starting
and ansible-core's module_utils being imported (their classes, dataclasses and enums built); the module
itself is a few milliseconds. The lab runs some 3,000 module runs per test suite on two shared cores, so
its hosts point `ansible_python_interpreter` at a client (module_zygote_client.py) that hands the run to
this server, which forks a process that has the controller's own ansible-core module_utils imported
already: about 0.03 CPU-seconds a run. Production hosts never get this file (docs/testing.md).

What a forked run sees is what `/usr/bin/python3 <script>` would see: the client's argv, environment,
working directory, umask, resource limits and standard streams (passed as descriptors), a fresh
`__main__`, and the exit status or signal handed back to the client. The preloaded code is used only for
files the payload carries with the same content: when the controller's ansible-core was upgraded, or
anything else differs, the payload runs in a fresh `/usr/bin/python3` exactly as without this server
(and the reason is logged). So a payload that lacks a module_utils file still fails as it would in
production: what a payload does not carry, it does not get from here except what it imports through
ansible-core's own (identical) files.

Usage:
  module_zygote.py serve --socket PATH --preload ZIP [--environment JSON]
      (the lab image's ddtree-lab-module-zygote.service; JSON: the locale and PYTHON* variables module
      runs get, which the server starts with so that their runs can be forks of it)
  module_zygote.py make-preload ZIP                    (on the controller, with its ansible-core: lab/up.yml)
"""

import argparse
import marshal
import os
import selectors
import socket
import struct
import sys
import zipfile

PYTHON = "/usr/bin/python3"
# What Python reads from the environment at start-up (and every PYTHON* variable): a run whose values
# differ from the server's runs in a fresh interpreter (the server's were fixed when it started).
STARTUP_ENVIRONMENT = ("LANG", "LC_ALL", "LC_CTYPE")
HEADER = struct.Struct("!I")
# The stubs AnsiballZ writes for these two packages (ansible.executor.module_common.recursive_finder): a
# payload carries these, not the controller's files.
ANSIBLE_STUB = (
    "from pkgutil import extend_path\n__path__=extend_path(__path__,__name__)\n"
    '__version__="{version}"\n__author__="{author}"\n'
)
MODULE_UTILS_STUB = "from pkgutil import extend_path\n__path__=extend_path(__path__,__name__)\n"


# Where the server's messages go (its journal): in a forked run, a copy of the server's stderr, since its
# own streams are the client's by then.
_LOG_FD = 2


def is_startup_variable(name):
    return name in STARTUP_ENVIRONMENT or name.startswith("PYTHON")


def startup_variables(environment):
    """The variables of an environment that Python reads as it starts."""
    return {name: value for name, value in environment.items() if is_startup_variable(name)}


def log(message):
    try:
        os.write(_LOG_FD, ("module_zygote: " + message + "\n").encode())
    except OSError:
        pass


# --- on the controller -------------------------------------------------------------------------------


def _stub_entry(name):
    """A zip entry for a file written from a string, dated like a file of a fixed date: the same ansible-core
    makes the same zip byte for byte, so lab/up copies it to a host (and restarts the zygote) only when it
    changed."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = 0o644 << 16
    return info


def make_preload(path):
    """Zip the running ansible-core's module_utils as AnsiballZ lays them out in payloads."""
    import ansible
    import ansible.module_utils

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    source = os.path.dirname(ansible.module_utils.__file__)
    partial = "%s.%d.tmp" % (path, os.getpid())
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(
            _stub_entry("ansible/__init__.py"),
            ANSIBLE_STUB.format(version=ansible.__version__, author=ansible.__author__),
        )
        archive.writestr(_stub_entry("ansible/module_utils/__init__.py"), MODULE_UTILS_STUB)
        for folder, folders, files in os.walk(source):
            folders[:] = sorted(name for name in folders if name != "__pycache__")
            for name in sorted(files):
                relative = os.path.relpath(os.path.join(folder, name), source)
                if name.endswith(".py") and relative != "__init__.py":
                    archive.write(os.path.join(folder, name), "ansible/module_utils/" + relative.replace(os.sep, "/"))
    os.replace(partial, path)


# --- the server --------------------------------------------------------------------------------------


class Zygote:
    def __init__(self, socket_path, preload):
        self.base_path = list(sys.path[1:])  # a fresh interpreter's path, less this file's folder
        self.startup_environment = startup_variables(os.environ)
        self.preload = preload
        self.preloaded = self._preload(preload)
        self.selector = selectors.DefaultSelector()
        self.listener = self._listen(socket_path)
        self.running = {}  # pidfd -> (pid, connection)
        self.script = None  # in a forked run: (argv, source), for a fresh interpreter after it started

    @staticmethod
    def _preload(preload):
        """Import what every payload imports, from the controller's ansible-core; remember its files."""
        with zipfile.ZipFile(preload) as archive:
            index = {info.filename: (info.CRC, info.file_size) for info in archive.infolist()}
        sys.path.insert(0, preload)
        try:
            import ansible.module_utils.basic  # noqa: F401
            from ansible.module_utils._internal._ansiballz import _loader
        finally:
            sys.path.remove(preload)
        # The rest of the wrapper's imports (ansible/_internal/_ansiballz/_wrapper.py), and what runpy needs.
        import base64  # noqa: F401
        import datetime  # noqa: F401
        import importlib  # noqa: F401
        import resource  # noqa: F401
        import runpy  # noqa: F401
        import shutil  # noqa: F401
        import tempfile  # noqa: F401
        import threading  # noqa: F401
        import traceback  # noqa: F401

        _loader.run_module = _checked_run_module(_loader.run_module)
        return index

    @staticmethod
    def _listen(socket_path):
        os.makedirs(os.path.dirname(socket_path), mode=0o755, exist_ok=True)
        try:
            os.unlink(socket_path)
        except FileNotFoundError:
            pass
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o077)  # root's alone: a run is root's
        try:
            listener.bind(socket_path)
        finally:
            os.umask(old_umask)
        listener.listen(64)
        return listener

    def serve(self):
        import gc

        # The forks share the preloaded objects: the collector leaves them be, so their pages stay shared.
        gc.freeze()
        self.selector.register(self.listener, selectors.EVENT_READ)
        log("ready (%d preloaded files, from %s)" % (len(self.preloaded), self.preload))
        while True:
            for key, _events in self.selector.select():
                if key.fileobj is self.listener:
                    self._accept()
                else:
                    self._reap(key.fd)

    def _accept(self):
        connection, _address = self.listener.accept()
        fds = []
        try:
            connection.settimeout(10)
            _pid, uid, _gid = struct.unpack(
                "3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            )
            if uid != os.getuid():  # the socket is root's alone (0600): no other user reaches this
                raise ValueError("a client of uid %d" % uid)
            request, fds = self._receive(connection)
            reason = self._refusal(request)
            if reason:
                log("fresh interpreter: " + reason)
                self._reply(connection, "fallback", reason)
                connection.close()
                return
            pid = os.fork()
            if pid == 0:
                self._child(connection, request, fds)  # never returns
            pidfd = os.pidfd_open(pid)
            self.running[pidfd] = (pid, connection)
            self.selector.register(pidfd, selectors.EVENT_READ)
            self._reply(connection, "pid", pid)
        except (OSError, ValueError) as error:
            log("request dropped: %s" % error)
            connection.close()
        finally:
            for fd in fds:
                os.close(fd)

    @staticmethod
    def _receive(connection):
        message, fds, _flags, _address = socket.recv_fds(connection, 1 << 20, 3)
        while len(message) < HEADER.size or len(message) < HEADER.size + HEADER.unpack_from(message)[0]:
            more = connection.recv(1 << 20)
            if not more:
                raise ValueError("the client went away mid-request")
            message += more
        # marshal, not json: the client imports only built-in modules; the peer is root (checked above).
        request = marshal.loads(message[HEADER.size : HEADER.size + HEADER.unpack_from(message)[0]])
        if len(fds) != 3:
            raise ValueError("expected the client's three standard streams, got %d descriptors" % len(fds))
        return request, fds

    def _refusal(self, request):
        """Why this run must start a fresh interpreter, or None."""
        wanted = startup_variables(request["environment"])
        changed = sorted(
            name
            for name in set(wanted) | set(self.startup_environment)
            if wanted.get(name) != self.startup_environment.get(name)
        )
        if changed:
            return "the run sets %s differently from the server" % ", ".join(changed)
        return None

    @staticmethod
    def _reply(connection, *words):
        connection.sendall(" ".join(str(word) for word in words).encode() + b"\n")

    def _reap(self, pidfd):
        pid, connection = self.running.pop(pidfd)
        self.selector.unregister(pidfd)
        os.close(pidfd)
        status = os.waitpid(pid, 0)[1]
        code = os.waitstatus_to_exitcode(status)
        try:
            self._reply(connection, *(("signal", -code) if code < 0 else ("exit", code)))
        except OSError:
            pass  # the client is gone; nobody waits for this status
        connection.close()

    # --- in the forked run ---------------------------------------------------------------------------

    def _child(self, connection, request, fds):
        code = 1
        try:
            self._detach(connection, fds)
            code = self._run(request)
        except BaseException:  # noqa: B036 - whatever happens, this process must not return into the server
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)

    def _detach(self, connection, fds):
        """Close the server's descriptors through their objects (so none is closed twice), take the client's
        streams as 0, 1 and 2, and leave the server's session."""
        for pidfd in self.running:
            os.close(pidfd)
        self.running.clear()
        self.selector.close()
        self.listener.close()
        connection.close()
        global _LOG_FD
        _LOG_FD = os.dup(2)  # not inherited across exec
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            os.close(fd)
        fds.clear()
        os.setsid()

    def _run(self, request):
        import io
        import locale
        import resource
        import time

        os.environ.clear()
        os.environ.update(request["environment"])
        time.tzset()
        try:
            locale.setlocale(locale.LC_CTYPE, "")
        except locale.Error:
            pass
        os.umask(request["umask"])
        for name, (soft, hard) in request["rlimits"].items():
            try:
                resource.setrlimit(getattr(resource, name), (soft, hard))
            except (ValueError, OSError):
                pass
        try:
            os.chdir(request["cwd"])
        except OSError:
            os.chdir("/")
        streams = []
        for fd, old in ((0, sys.stdin), (1, sys.stdout), (2, sys.stderr)):
            raw = io.FileIO(fd, "rb" if fd == 0 else "wb", closefd=False)
            buffered = io.BufferedReader(raw) if fd == 0 else io.BufferedWriter(raw)
            streams.append(
                io.TextIOWrapper(buffered, encoding=old.encoding, errors=old.errors, line_buffering=old.line_buffering)
            )
        sys.stdin, sys.stdout, sys.stderr = streams
        sys.__stdin__, sys.__stdout__, sys.__stderr__ = streams

        argv = request["argv"]
        if argv:
            with open(argv[0], "rb") as script:
                source = script.read()
            sys.path[:] = [os.path.dirname(os.path.abspath(argv[0]))] + self.base_path
        else:
            source = sys.stdin.buffer.read()
            sys.path[:] = [""] + self.base_path
        sys.argv[:] = list(argv) or [""]
        self.script = (argv, source)
        return _run_main(source, argv[0] if argv else None)


def _run_main(source, filename):
    """Run a script as `python3 <filename>` (or the script on standard input) would, and its exit code."""
    import atexit
    import threading
    import types

    main = types.ModuleType("__main__")
    main.__dict__["__builtins__"] = __builtins__
    if filename is not None:
        main.__file__ = filename
    sys.modules["__main__"] = main
    code = 0
    try:
        exec(compile(source, filename or "<stdin>", "exec"), main.__dict__)  # noqa: S102 - the client's script, as python3 would run it
    except SystemExit as done:
        code = _exit_code(done.code)
    except BaseException:  # noqa: B036 - an uncaught exception: Python prints it and exits 1
        import traceback

        traceback.print_exc()
        code = 1
    threading._shutdown()  # what the interpreter does at exit: wait for non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120
    return code


def _exit_code(value):
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    print(value, file=sys.stderr)
    return 1


def _checked_run_module(run_module):
    """Wrap AnsiballZ's run_module: the payload is on disk now, so compare what it carries of ansible-core
    with the preloaded files before any of them runs for it."""

    def checked(**arguments):
        modlib = arguments.get("modlib_path")
        reason, folders = _read_payload(modlib)
        if reason:
            _restart_fresh(modlib, reason)
        _extend_package_paths(modlib, folders)
        return run_module(**arguments)

    return checked


def _read_payload(modlib):
    """From the payload's zip directory (read once): why it cannot use the preloaded files, or None; and
    its folders."""
    if not modlib:
        return "no payload path", set()
    try:
        with zipfile.ZipFile(modlib) as archive:
            entries = archive.infolist()
    except (OSError, zipfile.BadZipFile) as error:
        return "the payload cannot be read (%s)" % error, set()
    for info in entries:
        kept = _SERVER.preloaded.get(info.filename)
        if kept is not None and kept != (info.CRC, info.file_size):
            return "the payload's %s differs from the controller's preloaded one" % info.filename, set()
    return None, {info.filename.rsplit("/", 1)[0] for info in entries if "/" in info.filename}


def _extend_package_paths(modlib, folders):
    """What pkgutil.extend_path gives these packages when the payload is on sys.path as they are imported:
    their folders in the payload come after the preloaded ones (ansible.modules, say, is only there)."""
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__path__", None)
        folder = name.replace(".", "/")
        if (name == "ansible" or name.startswith("ansible.")) and isinstance(path, list) and folder in folders:
            entry = os.path.join(modlib, folder)
            if entry not in path:
                path.append(entry)


def _restart_fresh(modlib, reason):
    """Run the same script in a fresh interpreter in this process (same pid, streams and environment)."""
    import shutil

    log("fresh interpreter: " + reason)
    argv, source = _SERVER.script
    if modlib:
        shutil.rmtree(os.path.dirname(modlib), ignore_errors=True)  # the wrapper's folder; the new run makes its own
    if not argv:
        script = os.memfd_create("ansible-module")
        os.write(script, source)
        os.lseek(script, 0, os.SEEK_SET)
        os.dup2(script, 0)
        os.close(script)
    os.execv(PYTHON, [PYTHON] + list(argv))


def start_with(environment_file):
    """Start again (same pid) if this process's locale and PYTHON* variables are not the file's."""
    import json

    with open(environment_file) as listed:
        wanted = json.load(listed)
    if startup_variables(os.environ) != startup_variables(wanted):
        environment = {name: value for name, value in os.environ.items() if not is_startup_variable(name)}
        environment.update(startup_variables(wanted))
        os.execve(sys.executable, [sys.executable] + sys.argv, environment)


_SERVER = None


def main():
    global _SERVER
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", maxsplit=1)[0])
    commands = parser.add_subparsers(dest="command", required=True)
    serve = commands.add_parser("serve")
    serve.add_argument("--socket", required=True)
    serve.add_argument("--preload", required=True)
    serve.add_argument("--environment")
    preload = commands.add_parser("make-preload")
    preload.add_argument("zip")
    options = parser.parse_args()
    if options.command == "make-preload":
        make_preload(options.zip)
        return
    if options.environment:
        start_with(options.environment)
    _SERVER = Zygote(options.socket, options.preload)
    _SERVER.serve()


if __name__ == "__main__":
    main()
