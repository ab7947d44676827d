"""Plugin mechanics, each in an interpreter of its own: discovery, registration, version refusal,
the plain-directory (PYTHONPATH + .dist-info) layout and the SGLANG_PLUGINS whitelist.

The probes run with run_probe: a child forked off a server that has imported torch and the other
third-party modules only, given the sys.path, environment and flags a fresh interpreter would have
(see _helpers.py); SGLang, its plugin discovery and the overlay load in the child, from nothing. The
one probe whose point is interpreters started by something else (SGLang's spawned scheduler
processes) starts real fresh interpreters."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from ._helpers import OVERLAY_ROOT, last_json_line, requires_sglang, run_probe, site_packages

pytestmark = [requires_sglang, pytest.mark.slow]

# Loads plugins the way SGLang's launcher does, then reports what it sees as one JSON line.
PROBE = r"""
import json, sys
from sglang.srt.plugins import load_plugins
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
load_plugins()
out = {}
try:
    algo = SpeculativeAlgorithm.from_string("DDTREE")
    out["ddtree"] = {"is_dflash": algo.is_dflash(), "is_dflash_family": algo.is_dflash_family(),
                     "type": type(algo).__name__}
except ValueError as exc:
    out["ddtree"] = {"error": str(exc)}
out["patched"] = sorted(HookRegistry._patched)
try:
    import sglang_overlay
    out["overlay_file"] = sglang_overlay.__file__
except ImportError as exc:
    out["overlay_file"] = None
from importlib.metadata import entry_points
out["entry_points"] = sorted(f"{ep.name}={ep.value}@{ep.dist._path}" for ep in entry_points(group="sglang.srt.plugins"))
print(json.dumps(out))
"""

DDTREE_HOOK_TARGETS = {
    "sglang.srt.server_args.ServerArgs.add_cli_args",
    "sglang.srt.server_args.ServerArgs.from_cli_args",
    "sglang.srt.speculative.spec_info.SpeculativeAlgorithm.create_worker",
}


def test_pyproject_declares_the_entry_point():
    with open(OVERLAY_ROOT / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    eps = project["entry-points"]["sglang.srt.plugins"]
    assert eps == {"ddtree": "sglang_overlay.adapter.plugin:load_plugin"}


def test_load_plugin_takes_no_arguments():
    import inspect

    from sglang_overlay.adapter.plugin import load_plugin

    assert list(inspect.signature(load_plugin).parameters) == []


def test_installed_distribution_is_discovered_and_registers_ddtree():
    proc = run_probe(PROBE)
    out = last_json_line(proc)
    assert out["ddtree"] == {"is_dflash": True, "is_dflash_family": True, "type": "DDTreeSpecAlgo"}, proc.stderr
    assert DDTREE_HOOK_TARGETS <= set(out["patched"])


def test_without_the_plugin_ddtree_is_unknown():
    proc = run_probe(PROBE, env={"SGLANG_PLUGINS": "some-other-plugin"})
    out = last_json_line(proc)
    assert "Unknown speculative algorithm name: DDTREE" in out["ddtree"]["error"]
    assert not (DDTREE_HOOK_TARGETS & set(out["patched"]))


def test_sglang_plugins_whitelist_naming_ddtree_loads_it():
    proc = run_probe(PROBE, env={"SGLANG_PLUGINS": "ddtree"})
    assert last_json_line(proc)["ddtree"]["is_dflash"] is True


FAKE_VERSION_PROBE = (
    r"""
import sglang.version
sglang.version.__version__ = "0.5.22"   # what another SGLang release would report
"""
    + PROBE
)


def test_refuses_another_sglang_version_with_a_logged_error():
    proc = run_probe(FAKE_VERSION_PROBE)
    out = last_json_line(proc)
    assert "Unknown speculative algorithm name: DDTREE" in out["ddtree"]["error"]
    assert not (DDTREE_HOOK_TARGETS & set(out["patched"])), "nothing may be patched"
    assert "Failed to load plugin ddtree" in proc.stderr
    assert "0.5.22" in proc.stderr and "0.5.23" in proc.stderr


def test_refusing_another_version_leaves_the_flags_unknown():
    code = r"""
import sglang.version
sglang.version.__version__ = "0.6.0"
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.server_args import prepare_server_args
prepare_server_args(["--model-path", "m", "--speculative-ddtree-budget", "4"])
"""
    proc = run_probe(code)
    assert proc.returncode == 2, proc.stderr
    assert "unrecognized arguments: --speculative-ddtree-budget" in proc.stderr


# ---- the release layout: a plain directory on PYTHONPATH holding the package + .dist-info ----


@pytest.fixture(scope="module")
def overlay_site_dir(tmp_path_factory) -> Path:
    """Build the overlay's wheel from a copy of the source and unpack it into a directory."""
    work = tmp_path_factory.mktemp("overlay-build")
    src_copy = work / "src-copy"
    shutil.copytree(
        OVERLAY_ROOT,
        src_copy,
        ignore=shutil.ignore_patterns("tests", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache"),
    )
    wheels = work / "wheels"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "-w",
            str(wheels),
            str(src_copy),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = wheels.glob("ddtree_sglang_overlay-*.whl")
    site = work / "site"
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(site)
    assert (site / "sglang_overlay" / "adapter" / "plugin.py").is_file()
    assert list(site.glob("ddtree_sglang_overlay-*.dist-info/entry_points.txt"))
    return site


def test_plain_directory_on_pythonpath_is_discovered(overlay_site_dir):
    # -S: no .pth processing, so this venv's own (editable) install of the overlay cannot be
    # imported; the only importable sglang_overlay is the one in the directory.
    # Forked, this still proves it: the probe server runs with -S too (and sees nothing of this
    # checkout), the child's sys.path is the one a fresh `python -S` with this PYTHONPATH reports,
    # and the .dist-info is found by load_plugins() scanning that sys.path, in the child.
    env = {"PYTHONPATH": f"{overlay_site_dir}:{site_packages()}"}
    proc = run_probe(PROBE, env=env, python_flags=("-S",))
    out = last_json_line(proc)
    assert out["ddtree"].get("is_dflash") is True, proc.stderr
    assert out["overlay_file"].startswith(str(overlay_site_dir))
    assert DDTREE_HOOK_TARGETS <= set(out["patched"])


def test_plain_directory_respects_the_whitelist(overlay_site_dir):
    env = {"PYTHONPATH": f"{overlay_site_dir}:{site_packages()}"}
    proc = run_probe(PROBE, env={**env, "SGLANG_PLUGINS": "ddtree"}, python_flags=("-S",))
    assert last_json_line(proc)["ddtree"].get("is_dflash") is True, proc.stderr
    proc = run_probe(PROBE, env={**env, "SGLANG_PLUGINS": "not-ddtree"}, python_flags=("-S",))
    assert "error" in last_json_line(proc)["ddtree"]


def test_without_the_directory_nothing_provides_ddtree():
    # The negative control of the test above: same flags, no overlay directory.
    proc = run_probe(PROBE, env={"PYTHONPATH": site_packages()}, python_flags=("-S",))
    out = last_json_line(proc)
    assert "error" in out["ddtree"]
    assert out["overlay_file"] is None


def test_child_processes_inherit_the_plugin(overlay_site_dir):
    # SGLang's scheduler processes are spawned children that call load_plugins() themselves.
    # Kept a real fresh interpreter (not run_probe): the point is what multiprocessing's spawn
    # starts from the parent's own start-up (its flags, its sys.path, the script as __main__), and
    # the spawned child, the costly part, is a fresh interpreter either way.
    code = r"""
import json, multiprocessing as mp

def child(q):
    from sglang.srt.plugins import load_plugins
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    load_plugins()
    q.put(SpeculativeAlgorithm.from_string("DDTREE").is_dflash_family())

if __name__ == "__main__":
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=child, args=(q,))
    p.start(); p.join(120)
    print(json.dumps({"child": q.get(timeout=5)}))
"""
    script = overlay_site_dir.parent / "spawn_probe.py"
    script.write_text(code)
    env = {"PYTHONPATH": f"{overlay_site_dir}:{site_packages()}"}
    proc = subprocess.run(
        [sys.executable, "-S", str(script)],
        env={**__import__("os").environ, **env},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert last_json_line(proc) == {"child": True}, proc.stderr
