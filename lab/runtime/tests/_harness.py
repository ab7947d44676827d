"""Start ``python -m ddtree_lab_runtime`` as a subprocess on a free loopback port and talk to it."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Optional

# The runtime's own source: importable in the runtimes the tests start, as the release's site dir
# makes it in the lab.
SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
MODEL = "/models/lab-target-8b"
DRAFT = "/models/lab-target-8b-dflash-b16"

# The lab stack has neither transformers nor torchvision. The overlay's test venv has transformers
# (for the reference tests); hide both from the runtime, so that it runs against SGLang as it is
# installed in the lab (and starts in ~2.5 s instead of ~8 s: sglang imports transformers eagerly
# when it is installed).
_BLOCKED = ("transformers", "torchvision")


def make_lab_stack_shadow(root: pathlib.Path) -> pathlib.Path:
    """A directory that, first on PYTHONPATH, makes ``import transformers``/``torchvision`` fail."""
    shadow = root / "lab-stack-shadow"
    for name in _BLOCKED:
        pkg = shadow / name
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text(f"raise ImportError('{name} is not installed in the lab stack')\n")
    return shadow


def make_broken_plugin(root: pathlib.Path) -> pathlib.Path:
    """A hand-made DDTREE plugin (the incident): registers DDTREE as a plain CustomSpecAlgo.

    Its ``is_dflash_family()`` is therefore False (SGLang's default for plugin algorithms), and
    nothing makes SGLang treat it as DFLASH.
    """
    site = root / "broken-plugin-site"
    pkg = site / "broken_ddtree_plugin"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(
        "def load():\n"
        "    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm\n"
        "    from sglang.srt.speculative.spec_registry import get_spec\n"
        "    if get_spec('DDTREE') is None:\n"
        "        SpeculativeAlgorithm.register('DDTREE', supports_overlap=True)(lambda server_args: None)\n"
    )
    info = site / "broken_ddtree_plugin-0.0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-ddtree-plugin\nVersion: 0.0.1\n")
    (info / "entry_points.txt").write_text("[sglang.srt.plugins]\nbroken = broken_ddtree_plugin:load\n")
    (info / "RECORD").write_text("")
    return site


# Sockets that hold the ports free_port() hands out, open until the test process exits.
_HELD_PORTS: list = []


def free_port() -> int:
    """A loopback port that nothing else on the machine is handed until this test process exits.

    A port found free and closed again is free to the next ``bind(("", 0))`` of any process, and a
    runtime binds its port seconds later (after importing SGLang and "loading" its weights), while
    other test stages start listeners of their own. So the port stays bound here, with SO_REUSEADDR
    and never listening: the kernel hands it to no other ephemeral bind or connect, and a connection
    to it is refused until the runtime (whose listener sets SO_REUSEADDR, as asyncio's does) listens
    on it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    _HELD_PORTS.append(sock)
    return sock.getsockname()[1]


class HTTPResult:
    def __init__(self, status: int, body: bytes, elapsed: float):
        self.status = status
        self.body = body
        self.elapsed = elapsed

    def json(self):
        return json.loads(self.body)

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


class Runtime:
    """One lab runtime process (started by this test run; stopped only through its own PID)."""

    def __init__(
        self,
        name: str,
        tmp: pathlib.Path,
        args: list,
        env: Optional[dict] = None,
        pythonpath: Optional[list] = None,
        model: str = MODEL,
    ):
        self.name = name
        self.port = free_port()
        self.log_path = tmp / f"{name}.log"
        self.argv = [sys.executable, "-m", "ddtree_lab_runtime", "--model-path", model, "--port", str(self.port), *args]
        full_env = {
            k: v for k, v in os.environ.items() if not k.startswith(("LAB_", "SGLANG_")) and k != "CUDA_VISIBLE_DEVICES"
        }
        # The given directories first (they may hide packages), then the runtime's source, then the test
        # run's own path, which holds the overlay under test (scripts/run-tests).
        inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        full_env["PYTHONPATH"] = os.pathsep.join([str(p) for p in [*(pythonpath or []), SRC]] + inherited)
        full_env["LAB_RUNTIME_LOAD_SECONDS"] = "0.2"
        full_env.update(env or {})
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            self.argv, stdout=self._log, stderr=subprocess.STDOUT, env=full_env, stdin=subprocess.DEVNULL
        )
        self.started = time.monotonic()

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def wait_for(self, marker: str, timeout: float = 300.0) -> bool:
        """True once ``marker`` is in the log; False if the process exited first or on timeout.

        The timeout only bounds a hang: a test module starts about ten runtimes at once, each importing
        SGLang and torch, beside other test workers on two cores."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if marker in self.log():
                return True
            if self.proc.poll() is not None:
                return marker in self.log()
            time.sleep(0.1)
        return False

    def wait_exit(self, timeout: float = 60.0) -> Optional[int]:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def request(
        self, method: str, path: str, payload=None, key: Optional[str] = None, timeout: float = 30.0
    ) -> HTTPResult:
        headers = {"Content-Type": "application/json"}
        if key:
            headers["Authorization"] = f"Bearer {key}"
        data = None if payload is None else json.dumps(payload).encode()
        req = urllib.request.Request(self.url(path), data=data, headers=headers, method=method)
        t0 = time.monotonic()
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return HTTPResult(resp.status, resp.read(), time.monotonic() - t0)
        except urllib.error.HTTPError as err:
            return HTTPResult(err.code, err.read(), time.monotonic() - t0)

    def get(self, path: str, **kw) -> HTTPResult:
        return self.request("GET", path, **kw)

    def post(self, path: str, payload, **kw) -> HTTPResult:
        return self.request("POST", path, payload, **kw)

    def generate(
        self, text: str, max_new_tokens: int = 96, key: Optional[str] = None, timeout: float = 30.0, **sampling
    ) -> dict:
        params = {"temperature": 0, "max_new_tokens": max_new_tokens, **sampling}
        res = self.post("/generate", {"text": text, "sampling_params": params}, key=key, timeout=timeout)
        assert res.status == 200, (res.status, res.text, self.log()[-3000:])
        return res.json()

    def terminate(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self._log.close()
