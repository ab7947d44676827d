"""Helpers of the adapter tests: SGLang availability and isolated Python subprocesses."""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import select
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

import pytest

OVERLAY_ROOT = Path(__file__).resolve().parents[2]  # sglang_overlay/
SRC = OVERLAY_ROOT / "src"


def sglang_missing_reason() -> Optional[str]:
    """Why SGLang's CPU-importable parts are unavailable here, or None."""
    try:
        if importlib.util.find_spec("sglang") is None:
            return "sglang is not installed"
        import sglang.srt.plugins  # noqa: F401
        import sglang.srt.server_args  # noqa: F401
        import sglang.srt.speculative.spec_info  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means: not importable
        return f"sglang is not importable: {type(exc).__name__}: {exc}"
    return None


_REASON = sglang_missing_reason()
requires_sglang = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")


def site_packages() -> str:
    """The directory SGLang (and torch) are installed in: the PYTHONPATH of the ``-S`` probes."""
    spec = importlib.util.find_spec("sglang")
    return str(Path(spec.origin).resolve().parents[1])


# ---- forked probes: a fresh interpreter's answer without paying torch's import every time ----
#
# A probe in a fresh interpreter (``python FLAGS -c CODE``) imports SGLang, and SGLang imports torch,
# transformers, scipy, ... first: about 10 CPU seconds, of which SGLang's own modules and the
# overlay take 1-2 (measured with -X importtime on the 2-core dev machine). run_probe answers the same question from a child forked off a server
# process that has imported only those third-party modules (PRELOAD), the way the deploy tooling
# runs its programs (plugins/module_utils/forked_jobs.py). Never SGLang or the overlay: the plugin
# hooks SGLang when it loads, whitelists and version checks act at load_plugins() time, and every
# probe must start from an SGLang that no plugin has seen.
#
# The child is made to look like that fresh interpreter:
# - the server runs with the probe's interpreter flags (one server per flag set, so ``-S`` means no
#   site processing, no .pth file run, in the server as in the fresh interpreter);
# - sys.path is the one a real fresh interpreter with the same flags and environment reports (asked
#   per probe: ``python FLAGS -c 'print(sys.path)'`` imports nothing and costs milliseconds), so
#   PYTHONPATH entries, the .dist-info directories and their order are exactly the fresh ones;
#   finder and metadata caches are dropped;
# - each preloaded third-party package must be the file that sys.path would import (else the probe
#   fails: the preload would not be what that interpreter imports);
# - os.environ is the probe's environment (plus what the preload itself set, as it would have);
# - the code runs as ``__main__`` with sys.argv ``['-c', *args]``; SystemExit, an uncaught
#   exception and atexit handlers end it as they end an interpreter; stdout/stderr are its own.
# What forking cannot reproduce is the interpreter's own start-up beyond sys.path (how -m finds a
# module, multiprocessing's spawned children): such probes start a real fresh interpreter.

PRELOAD = (
    # Third-party modules SGLang imports before (and besides) its own, heaviest first. A name that
    # does not import here is skipped: the probe imports it itself, or fails on it.
    "torch",
    "transformers",
    "transformers.activations",
    "transformers.modeling_layers",
    "transformers.modeling_utils",
    "transformers.modeling_gguf_pytorch_utils",
    "transformers.generation",
    "transformers.image_processing_utils",
    "numpy",
    "scipy",
    "sympy",
    "triton",
    "aiohttp",
    "requests",
    "IPython.display",
    "pydantic",
    "pydantic.main",
    "psutil",
    "zmq",
    "PIL.Image",
    "starlette.routing",
    "msgspec",
)

_SERVER = r"""
import atexit, builtins, importlib, importlib.machinery, json, os, sys, traceback, types

# Answers go out on a copy of stdout; what the preload itself prints goes to stderr (the log).
answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
spec = json.loads(sys.argv[1])
before_env, before_mods, start_path = dict(os.environ), set(sys.modules), list(sys.path)
# A directory the preload needs (the venv's site-packages under -S) goes last, for the preload only.
sys.path.extend(p for p in spec["preload_path"] if p not in sys.path)
for name in spec["preload"]:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
preload_sys_path = list(sys.path)
sys.path[:] = start_path
env_set = {k: v for k, v in os.environ.items() if before_env.get(k) != v}
env_unset = [k for k in before_env if k not in os.environ]
stdlib = set(sys.stdlib_module_names)
preloaded = {}
for name in set(sys.modules) - before_mods:
    module = sys.modules[name]
    mspec = getattr(module, "__spec__", None)
    if "." in name or name in stdlib or mspec is None or not mspec.has_location:
        continue
    # Only what sys.path provides as a top-level module (not an extension module that names itself so).
    found = importlib.machinery.PathFinder.find_spec(name, preload_sys_path)
    if found is not None and found.origin == mspec.origin:
        preloaded[name] = mspec.origin


def run(job):
    os.close(answers.fileno())
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(job["stdout"], os.O_WRONLY | os.O_TRUNC)
    err = os.open(job["stderr"], os.O_WRONLY | os.O_TRUNC)
    os.dup2(null, 0); os.dup2(out, 1); os.dup2(err, 2)
    os.environ.clear()
    os.environ.update(job["env"])
    os.environ.update(env_set)
    for key in env_unset:
        os.environ.pop(key, None)
    sys.path[:] = job["sys_path"]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    for name, origin in sorted(preloaded.items()):
        found = importlib.machinery.PathFinder.find_spec(name, sys.path)
        if found is None or found.origin != origin:
            print(f"forked probe: preloaded {name} is {origin}, this sys.path imports "
                  f"{found and found.origin}; run it in a fresh interpreter", file=sys.stderr)
            return 70
    sys.argv = ["-c", *job["args"]]
    main = types.ModuleType("__main__")
    main.__builtins__ = builtins
    main.__loader__ = importlib.machinery.BuiltinImporter
    sys.modules["__main__"] = main
    rc = 0
    try:
        exec(compile(job["code"], "<string>", "exec"), main.__dict__)
    except SystemExit as exc:
        if exc.code is None:
            rc = 0
        elif isinstance(exc.code, int):
            rc = exc.code
        else:
            print(exc.code, file=sys.stderr)
            rc = 1
    except BaseException:
        kind, value, tb = sys.exc_info()
        value.with_traceback(tb.tb_next)  # the traceback starts in the probe's code, as it would
        sys.excepthook(kind, value, tb.tb_next)
        rc = 1
    atexit._run_exitfuncs()
    return rc


requests = sys.stdin.buffer
print(json.dumps({"ready": sorted(preloaded)}), file=answers, flush=True)
for line in requests:
    job = json.loads(line)
    pid = os.fork()
    if pid == 0:
        rc = 70
        try:
            rc = run(job)
        except BaseException:
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush(); sys.stderr.flush()
            finally:
                os._exit(rc & 0xFF)
    _, status = os.waitpid(pid, 0)
    print(json.dumps({"rc": os.waitstatus_to_exitcode(status)}), file=answers, flush=True)
"""


class _ProbeServer:
    """One forking server (per interpreter flag set, per pytest process)."""

    def __init__(self, python_flags: tuple):
        self.python_flags = python_flags
        env = _probe_env(None)
        preload_path = [site_packages()]
        if "-S" in python_flags:
            # Nothing of this checkout (no overlay source, no .dist-info): only where torch lives.
            env["PYTHONPATH"] = site_packages()
        self._log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [
                sys.executable,
                *python_flags,
                "-c",
                _SERVER,
                json.dumps({"preload": list(PRELOAD), "preload_path": preload_path}),
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            start_new_session=True,
        )
        self._read(600)

    def _read(self, timeout: float) -> dict:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else b""
        if not line:
            self.close(kill=True)
            self._log.seek(0)
            if not ready:
                raise subprocess.TimeoutExpired(self.proc.args[:3], timeout)
            raise RuntimeError("the probe server died:\n" + self._log.read().decode(errors="replace")[-4000:])
        return json.loads(line)

    def run(self, job: dict, timeout: float) -> int:
        self.proc.stdin.write((json.dumps(job) + "\n").encode())
        self.proc.stdin.flush()
        return self._read(timeout)["rc"]

    def close(self, kill: bool = False) -> None:
        if self.proc.poll() is None:
            if kill:
                os.killpg(self.proc.pid, 9)
            else:
                self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()
        _SERVERS.pop(self.python_flags, None)


_SERVERS: dict = {}


@atexit.register
def _close_servers() -> None:
    # Waited for, so that their CPU time is counted with this process's.
    for server in list(_SERVERS.values()):
        server.close()


def _probe_env(env: Optional[dict]) -> dict:
    full_env = dict(os.environ)
    full_env.pop("SGLANG_PLUGINS", None)
    full_env.update(env or {})
    return full_env


def fresh_sys_path(full_env: dict, python_flags: tuple = ()) -> list:
    """sys.path of a fresh ``python FLAGS -c ...`` started with this environment."""
    proc = subprocess.run(
        [sys.executable, *python_flags, "-c", "import json, sys; print(json.dumps(sys.path))"],
        env=full_env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return json.loads(proc.stdout)


def run_probe(
    code: str,
    env: Optional[dict] = None,
    args: tuple = (),
    python_flags: tuple = (),
    timeout: int = 240,
) -> subprocess.CompletedProcess:
    """What ``python FLAGS -c CODE ARGS`` in ENV (SGLANG_PLUGINS unset unless given) returns, answered by a
    forked child of a preloaded server (above)."""
    full_env = _probe_env(env)
    sys_path = fresh_sys_path(full_env, python_flags)
    server = _SERVERS.get(python_flags)
    if server is None:
        server = _SERVERS[python_flags] = _ProbeServer(python_flags)
    with tempfile.NamedTemporaryFile() as out, tempfile.NamedTemporaryFile() as err:
        rc = server.run(
            {
                "code": code,
                "args": list(args),
                "env": full_env,
                "sys_path": sys_path,
                "stdout": out.name,
                "stderr": err.name,
            },
            timeout,
        )
        stdout = Path(out.name).read_text(errors="replace")
        stderr = Path(err.name).read_text(errors="replace")
    return subprocess.CompletedProcess([sys.executable, *python_flags, "-c", code, *args], rc, stdout, stderr)


def last_json_line(proc: subprocess.CompletedProcess) -> dict:
    """The last stdout line that parses as JSON (SGLang may log to stdout too)."""
    for line in reversed(proc.stdout.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    raise AssertionError(f"no JSON line in stdout:\n{proc.stdout}\n--- stderr:\n{proc.stderr}")


@pytest.fixture(scope="module")
def plugin_in_process():
    """Load the plugin into this (pytest) process, as load_plugins() would, and apply its hooks.

    Registration is idempotent and only adds DDTREE, its flags and hooks that act on DDTree
    records; other tests in this process are unaffected.
    """
    from sglang.srt.plugins.hook_registry import HookRegistry

    from sglang_overlay.adapter.plugin import is_loaded, load_plugin

    load_plugin()
    HookRegistry.apply_hooks()
    assert is_loaded()
    return True
