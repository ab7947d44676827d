"""What a production host receives carries no lab and no fault code.

The overlay's wheel is built the way the sglang_service role builds it (ddtree.sglang.overlay_build on
this checkout's sglang_overlay/), and the Galaxy artifact the way `ansible-galaxy collection build`
makes it; neither may hold the lab runtime, its fault switches, or a module that carries a fault.
The lab's releases get the runtime from lab/runtime/ (lab/runtime/README.md), never from these.
"""

import re
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from conftest import REPO_ROOT, run_module

from ansible_collections.ddtree.sglang.plugins.modules import overlay_build

# A path part or a text that only lab or fault-injection code has.
LAB_PATH = re.compile(r"(^|/)(lab|lab_runtime|ddtree_lab_runtime|molecule)(/|$)|release_fault|(^|/)faults?\.py$")
# What galaxy.yml's build_ignore leaves out of the artifact.
NOT_SHIPPED = re.compile(
    r"^(lab|molecule|collections|inventories/lab|\.cache|\.gpuwhl)/|__pycache__|\.egg-info|\.pytest_cache"
)
LAB_TEXT = re.compile(r"LAB_RUNTIME_FAULT|release_fault|ddtree_lab_runtime|lab_runtime|crash_at_start")


def lab_code(names_and_texts):
    """The (name, reason) of every member that is lab or fault code."""
    found = []
    for name, text in names_and_texts:
        if LAB_PATH.search(name):
            found.append((name, "path"))
        elif text is not None and LAB_TEXT.search(text):
            found.append((name, "mentions %s" % LAB_TEXT.search(text).group(0)))
    return found


def test_the_rule_catches_what_the_overlay_used_to_ship():
    assert lab_code(
        [
            ("sglang_overlay/lab_runtime/faults.py", None),
            ("sglang_overlay/release_fault.py", None),
            ("sglang_overlay/core/x.py", "FAULT = os.environ['LAB_RUNTIME_FAULT']"),
        ]
    ) == [
        ("sglang_overlay/lab_runtime/faults.py", "path"),
        ("sglang_overlay/release_fault.py", "path"),
        ("sglang_overlay/core/x.py", "mentions LAB_RUNTIME_FAULT"),
    ]
    assert lab_code([("sglang_overlay/core/tree.py", "def build_tree(): ...")]) == []


def test_the_production_overlay_wheel_has_no_lab_or_fault_code(tmp_path, capsys):
    code, result = run_module(
        overlay_build, {"source": str(REPO_ROOT / "sglang_overlay"), "dest": str(tmp_path)}, capsys
    )
    assert code == 0, result.get("msg")
    with zipfile.ZipFile(result["wheel"]) as wheel:
        members = [
            (name, wheel.read(name).decode("utf-8", "replace") if name.endswith((".py", ".txt", "METADATA")) else None)
            for name in wheel.namelist()
        ]
    assert any(name == "sglang_overlay/core/tree.py" for name, _text in members)  # it is the overlay
    assert lab_code(members) == []


def test_the_galaxy_artifact_has_no_lab_or_fault_code(tmp_path):
    galaxy = Path(sys.executable).with_name("ansible-galaxy")
    if not galaxy.exists():
        pytest.skip("ansible-galaxy is not beside this Python (run through scripts/test)")
    subprocess.run(
        [str(galaxy), "collection", "build", "--output-path", str(tmp_path), str(REPO_ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    (artifact,) = tmp_path.glob("*.tar.gz")
    with tarfile.open(artifact) as tar:
        members = []
        for member in tar.getmembers():
            text = None
            # The code that runs on hosts or controllers (the docs may say what the lab sets; the tests
            # name what they look for).
            if (
                member.isfile()
                and member.name.endswith(".py")
                and member.name.startswith(("plugins/", "roles/", "sglang_overlay/src/"))
            ):
                text = tar.extractfile(member).read().decode("utf-8", "replace")
            members.append((member.name, text))
    assert any(name == "sglang_overlay/src/sglang_overlay/core/tree.py" for name, _text in members)
    assert lab_code(members) == []
    # The collection alone: none of the checkout's test beds, caches or build output (galaxy.yml's build_ignore).
    assert [name for name, _text in members if NOT_SHIPPED.search(name)] == []
