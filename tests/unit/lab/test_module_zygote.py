"""The lab's module zygote (lab/image/module_zygote.py) must change nothing a module run sees: a payload run
through the lab's interpreter answers as `/usr/bin/python3 <payload>` does, and whatever the preloaded code
cannot stand in for exactly runs in a fresh interpreter.

Which process ran a module is read from the module itself: its command's parent is the module's process,
whose command line is the zygote's (`module_zygote.py serve ...`) for a forked run, `/usr/bin/python3` for a
fresh one."""

import json
import os
import signal
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
SERVER = REPO / "lab/image/module_zygote.py"
CLIENT = REPO / "lab/image/module_zygote_client.py"
PYTHON = "/usr/bin/python3"  # what the lab hosts run, and what the client falls back to
# The command module reports its own process's command line, the environment and working directory it got.
PROBE = ["sh", "-c", 'tr "\\0" " " < /proc/$PPID/cmdline; echo; echo "$DDTREE_PROBE"; pwd; umask; exit 3']

pytestmark = [
    pytest.mark.skipif(not os.path.exists(PYTHON), reason="the lab hosts' interpreter, /usr/bin/python3, is not here"),
    pytest.mark.skipif(os.getuid() != 0, reason="the lab runs modules as root; other users get a fresh interpreter"),
]


@pytest.fixture(scope="module")
def payloads(tmp_path_factory):
    """AnsiballZ payloads as the controller's ansible-core builds them, kept on disk: `ping`, and `probe`
    (the command module running PROBE). One ansible-playbook run for both."""
    keep = tmp_path_factory.mktemp("payloads")
    playbook = keep / "payloads.yml"
    playbook.write_text(
        json.dumps(
            [
                {
                    "hosts": "localhost",
                    "gather_facts": False,
                    "tasks": [
                        {"ansible.builtin.ping": {}},
                        {"ansible.builtin.command": {"argv": PROBE}, "ignore_errors": True},
                    ],
                }
            ]
        )
    )
    environment = dict(
        os.environ,
        ANSIBLE_KEEP_REMOTE_FILES="1",
        ANSIBLE_REMOTE_TMP=str(keep / "tmp"),
        ANSIBLE_PIPELINING="0",
        ANSIBLE_LOCALHOST_WARNING="0",
        ANSIBLE_INVENTORY_UNPARSED_WARNING="0",
    )
    ran = subprocess.run(
        [
            str(Path(sys.executable).parent / "ansible-playbook"),
            "-i",
            "localhost,",
            "-c",
            "local",
            "-e",
            "ansible_python_interpreter=" + PYTHON,
            str(playbook),
        ],
        env=environment,
        cwd=keep,
        capture_output=True,
        text=True,
        check=False,
    )
    found = {path.name: path for path in (keep / "tmp").rglob("AnsiballZ_*.py")}
    assert {"AnsiballZ_ping.py", "AnsiballZ_command.py"} <= set(found), ran.stdout + ran.stderr
    return {"ping": found["AnsiballZ_ping.py"], "probe": found["AnsiballZ_command.py"]}


class Zygote:
    def __init__(self, folder, preload):
        self.socket = folder / "zygote.sock"
        self.log = folder / "zygote.log"
        with open(self.log, "wb") as log:
            self.process = subprocess.Popen(
                [PYTHON, str(SERVER), "serve", "--socket", str(self.socket), "--preload", str(preload)],
                stderr=log,
                stdout=subprocess.DEVNULL,
            )
        deadline = time.monotonic() + 30
        while "ready" not in self.log.read_text():
            assert self.process.poll() is None and time.monotonic() < deadline, self.log.read_text()
            time.sleep(0.05)

    def run(self, *argv, stdin=None, **options):
        environment = dict(options.pop("env", os.environ), DDTREE_LAB_MODULE_ZYGOTE=str(self.socket))
        return subprocess.run(
            [PYTHON, "-IS", str(CLIENT), *map(str, argv)],
            input=stdin,
            capture_output=True,
            env=environment,
            check=False,
            **options,
        )

    def stop(self):
        self.process.terminate()
        self.process.wait(timeout=10)


def make_preload(path):
    subprocess.run([sys.executable, str(SERVER), "make-preload", str(path)], check=True)
    return path


@pytest.fixture(scope="module")
def zygote(tmp_path_factory):
    folder = tmp_path_factory.mktemp("zygote")
    server = Zygote(folder, make_preload(folder / "ansible.zip"))
    yield server
    server.stop()


def probe_result(completed):
    """The command module's result, and what the probe printed: the module process's command line, the
    environment's DDTREE_PROBE, the working directory and the umask."""
    result = json.loads(completed.stdout)
    assert "stdout" in result, "the module did not run: %s" % result.get("msg", result)
    module_cmdline, value, cwd, umask = result["stdout"].splitlines()
    return result, module_cmdline.split(), value, cwd, umask


def test_a_payload_runs_in_a_fork_and_answers_as_a_fresh_interpreter(zygote, payloads, tmp_path):
    os.chmod(tmp_path, 0o755)
    for run in (
        lambda: zygote.run(payloads["probe"], env=dict(os.environ, DDTREE_PROBE="passed"), cwd=tmp_path),
        lambda: zygote.run(
            stdin=payloads["probe"].read_bytes(), env=dict(os.environ, DDTREE_PROBE="passed"), cwd=tmp_path
        ),
    ):
        completed = run()
        result, module_cmdline, value, cwd, umask = probe_result(completed)
        assert module_cmdline[:3] == [PYTHON, str(SERVER), "serve"], "the module did not run in the zygote"
        assert (result["rc"], result["failed"], value, cwd) == (3, True, "passed", str(tmp_path))
        assert umask == "%04o" % current_umask()
        assert completed.returncode == 1  # a failed module exits 1
    fresh = subprocess.run(
        [PYTHON, str(payloads["probe"])],
        capture_output=True,
        env=dict(os.environ, DDTREE_PROBE="passed"),
        cwd=tmp_path,
        check=False,
    )
    assert fresh.returncode == completed.returncode
    assert json.loads(fresh.stdout).keys() == result.keys()
    assert "fresh interpreter" not in zygote.log.read_text()
    ping = zygote.run(stdin=payloads["ping"].read_bytes())
    assert (ping.returncode, json.loads(ping.stdout)) == (0, {"ping": "pong"})


def current_umask():
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_a_run_whose_start_up_variables_differ_gets_a_fresh_interpreter(zygote, payloads):
    completed = zygote.run(payloads["probe"], env=dict(os.environ, PYTHONHASHSEED="7"))
    module_cmdline = probe_result(completed)[1]
    assert module_cmdline == [PYTHON, str(payloads["probe"])]
    assert "fresh interpreter: the run sets PYTHONHASHSEED differently" in zygote.log.read_text()


def test_a_payload_of_another_ansible_core_runs_in_a_fresh_interpreter(payloads, tmp_path):
    """The preloaded basic.py differs from the payload's (as after an upgrade of the controller's ansible-core):
    the payload runs in a fresh interpreter, and still answers."""
    preload = make_preload(tmp_path / "ansible.zip")
    changed = tmp_path / "changed.zip"
    with zipfile.ZipFile(preload) as original, zipfile.ZipFile(changed, "w") as copy:
        for info in original.infolist():
            content = original.read(info)
            copy.writestr(
                info,
                content + b"\n# another version\n" if info.filename == "ansible/module_utils/basic.py" else content,
            )
    server = Zygote(tmp_path, changed)
    try:
        completed = server.run(stdin=payloads["probe"].read_bytes())
    finally:
        server.stop()
    result, module_cmdline = probe_result(completed)[:2]
    assert module_cmdline == [PYTHON] and result["rc"] == 3
    assert "fresh interpreter: the payload's ansible/module_utils/basic.py differs" in server.log.read_text()


def test_without_a_zygote_the_interpreter_is_plain_python(payloads, tmp_path):
    completed = subprocess.run(
        [PYTHON, "-IS", str(CLIENT), str(payloads["probe"])],
        capture_output=True,
        check=False,
        env=dict(os.environ, DDTREE_LAB_MODULE_ZYGOTE=str(tmp_path / "none.sock")),
    )
    module_cmdline = probe_result(completed)[1]
    assert module_cmdline == [PYTHON, str(payloads["probe"])]


@pytest.mark.parametrize(
    ("script", "returncode", "stderr"),
    [
        ("import sys; sys.exit(7)", 7, ""),
        ("raise SystemExit('bye')", 1, "bye"),
        ("raise ValueError('no good')", 1, "ValueError: no good"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", -signal.SIGTERM, ""),
        ("import atexit, sys; atexit.register(lambda: print('at exit', file=sys.stderr))", 0, "at exit"),
    ],
)
def test_exit_statuses_signals_and_exit_handlers_are_the_scripts(zygote, script, returncode, stderr):
    completed = zygote.run(stdin=script.encode())
    assert completed.returncode == returncode
    assert stderr in completed.stderr.decode()


def test_a_named_script_gets_its_arguments_and_folder_on_the_path(zygote, tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import sys; print(sys.argv, sys.path[0] == %r, __name__, __file__)\n" % str(tmp_path))
    completed = zygote.run(script, "--flag", "value")
    assert completed.stdout.decode().split() == [
        "[%r," % str(script),
        "'--flag',",
        "'value']",
        "True",
        "__main__",
        str(script),
    ]


def test_the_same_ansible_core_makes_the_same_preload_byte_for_byte(tmp_path):
    # lab/up copies the preload to each host and restarts the zygote when the copy changed: a zip that
    # differed by its entries' dates would restart every kept host's zygote on every lab/up.
    first = make_preload(tmp_path / "first.zip").read_bytes()
    time.sleep(2.1)  # zip dates count in 2-second steps
    assert make_preload(tmp_path / "second.zip").read_bytes() == first
