"""The units' launcher (roles/sglang_service/files/sglang_launch.py): the API key from standard input (the
unit's StandardInput=file:) into the server's own argument list, in no argv, and redacted from everything
the server prints."""

import importlib.util
import io
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

LAUNCHER = Path(__file__).resolve().parents[3] / "roles" / "sglang_service" / "files" / "sglang_launch.py"
KEY = "sk-test-0f3c9a51e2"

spec = importlib.util.spec_from_file_location("sglang_launch", LAUNCHER)
launch = importlib.util.module_from_spec(spec)
spec.loader.exec_module(launch)

# A stand-in for sglang.launch_server: what SGLang 0.5.23 does with its arguments and its output.
FAKE_SERVER = textwrap.dedent("""
    import json, logging, multiprocessing, sys

    def child_square(value):
        return value * value

    if __name__ == "__main__":
        # SGLang's prepare_server_args: basicConfig(force=True) replaces every handler, on sys.stderr.
        logging.basicConfig(level=logging.INFO, format="[t] %(message)s", force=True)
        args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
        logging.getLogger("engine").info("server_args=%s", {"port": args["--port"], "api_key": args.get("--api-key")})
        print("argv ends with the key:", sys.argv[-2:] == ["--api-key", open(sys.argv[0] + ".key").read().strip()])
        with open("/proc/self/cmdline", "rb") as handle:
            print("key in /proc/self/cmdline:", open(sys.argv[0] + ".key").read().strip().encode() in handle.read())
        # SGLang starts its schedulers with the spawn method: the module must import again as __mp_main__.
        with multiprocessing.get_context("spawn").Pool(1) as pool:
            print("spawned child:", pool.apply(child_square, (7,)))
        print("half a line with the key: " + args.get("--api-key", "")[:5], end="", flush=True)
        print(args.get("--api-key", "")[5:], flush=True)
        if args.get("--fail") == "raise":
            raise RuntimeError("could not start with key " + args.get("--api-key", ""))
        sys.exit(int(args.get("--exit", "0")))
""")


@pytest.fixture
def server(tmp_path):
    modules = tmp_path / "site"
    modules.mkdir()
    (modules / "fake_server.py").write_text(FAKE_SERVER)
    (modules / "fake_server.py.key").write_text(KEY + "\n")
    key_file = tmp_path / "coder.api-key"
    key_file.write_text(KEY + "\n")

    def start(*flags, with_key=True):
        env = dict(os.environ, PYTHONPATH=str(modules))
        launcher = [sys.executable, str(LAUNCHER)] + (["--stdin-flag", "api-key"] if with_key else [])
        # As systemd's StandardInput=file: does it.
        with open(key_file if with_key else os.devnull, encoding="utf-8") as stdin:
            return subprocess.run(
                launcher + ["fake_server", "--port", "30000", *flags],
                stdin=stdin,
                env=env,
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )

    return start


def test_the_key_reaches_the_server_in_no_argv_and_is_redacted_from_its_output(server):
    proc = server()
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert KEY not in output
    assert "server_args={'port': '30000', 'api_key': '<redacted>'}" in proc.stderr
    assert "argv ends with the key: True" in proc.stdout
    assert "key in /proc/self/cmdline: False" in proc.stdout
    assert "spawned child: 49" in proc.stdout
    # Written in two pieces, the key is still caught.
    assert "half a line with the key: <redacted>\n" in proc.stdout


def test_exit_statuses_and_tracebacks_are_the_servers(server):
    assert server("--exit", "2").returncode == 2  # a bad flag: systemd's RestartPreventExitStatus=2
    proc = server("--fail", "raise")
    assert proc.returncode == 1 and "RuntimeError: could not start with key <redacted>" in proc.stderr
    assert KEY not in proc.stdout + proc.stderr


def test_without_a_key_the_server_runs_unchanged(server):
    proc = server(with_key=False)
    assert proc.returncode == 0, proc.stderr
    assert "'api_key': None" in proc.stderr and "argv ends with the key: False" in proc.stdout


def test_a_server_that_re_executes_itself_gets_the_key_again(server, tmp_path):
    # The lab runtime re-executes itself once with its own command line (os.execve, sys.orig_argv) to set
    # its environment: the launcher runs again on the same standard input.
    (tmp_path / "site" / "fake_server.py").write_text(
        textwrap.dedent("""
        import os, sys
        if not os.environ.get("REEXECUTED"):
            os.execve(sys.executable, list(sys.orig_argv), dict(os.environ, REEXECUTED="1"))
        print("after re-exec, argv ends with the key:", sys.argv[-2:] == ["--api-key", open(sys.argv[0] + ".key").read().strip()])
    """)
    )
    proc = server()
    assert proc.returncode == 0 and "after re-exec, argv ends with the key: True" in proc.stdout, (
        proc.stdout + proc.stderr
    )


@pytest.mark.parametrize(
    "content, message",
    [
        ("\n", "standard input holds nothing for --api-key"),
        ("sk-first\nsk-second\n", "standard input holds several lines for --api-key"),
    ],
)
def test_a_bad_key_file_is_a_usage_error_that_prints_no_secret(content, message):
    with pytest.raises(launch.UsageError, match=message) as error:
        launch.read_secret(io.StringIO(content), "api-key")
    assert "sk-" not in str(error.value)


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "usage: sglang_launch.py"),
        (["--port", "1"], "usage: sglang_launch.py"),
        (["--stdin-flag"], "--stdin-flag needs a flag's name"),
        (["--stdin-flag", "--api-key", "sglang.launch_server"], "--stdin-flag needs a flag's name"),
    ],
)
def test_a_wrong_call_is_a_usage_error(argv, message):
    with pytest.raises(launch.UsageError, match=message):
        launch.parse_args(argv)


def test_no_module_exits_2():
    proc = subprocess.run([sys.executable, str(LAUNCHER)], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and "usage: sglang_launch.py" in proc.stderr


@pytest.mark.parametrize(
    "writes",
    [
        [KEY + "\n"],
        ["a " + KEY[:3], KEY[3:] + " b\n"],
        ["x" + KEY[:-1], "", KEY[-1:] + "\n"],
        [KEY[:1], KEY[1:2], KEY[2:] + "\n"],
    ],
)
def test_a_key_split_across_writes_and_flushes_is_redacted(writes):
    out = io.StringIO()
    stream = launch.RedactingStream(out, [KEY])
    for text in writes:
        stream.write(text)
        stream.flush()  # logging flushes after every record; print(flush=True) too
    stream.close_flush()
    assert KEY not in out.getvalue() and "<redacted>" in out.getvalue()
    assert out.getvalue().replace("<redacted>", KEY) == "".join(writes)


def test_flush_holds_back_only_what_may_begin_a_key():
    out = io.StringIO()
    stream = launch.RedactingStream(out, [KEY])
    stream.write("progress 10% " + KEY[:4])
    stream.flush()
    assert out.getvalue() == "progress 10% "
    stream.write("not the key\n")
    assert out.getvalue() == "progress 10% " + KEY[:4] + "not the key\n"
