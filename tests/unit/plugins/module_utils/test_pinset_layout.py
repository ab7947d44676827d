"""Pin-set helpers and the host-layout rules for pruning stacks."""

import json
import os

import pytest

from ansible_collections.ddtree.sglang.plugins.module_utils import layout, pinset


def test_wheel_platforms_for_debian12():
    tags = pinset.wheel_platforms("2.36")
    assert tags[0] == "manylinux_2_36_x86_64"
    assert "manylinux_2_34_x86_64" in tags and "manylinux_2_17_x86_64" in tags
    assert "manylinux_2_37_x86_64" not in tags
    assert tags[-4:] == ["manylinux2014_x86_64", "manylinux_2_5_x86_64", "manylinux1_x86_64", "linux_x86_64"]


@pytest.mark.parametrize("bad", ["3.1", "2.5", "two"])
def test_wheel_platforms_rejects_bad_glibc(bad):
    with pytest.raises(ValueError):
        pinset.wheel_platforms(bad)


def test_lock_name_and_stack_id():
    assert pinset.lock_name("3.11.2") == "requirements-py311.lock"
    first = pinset.stack_id("lab-cpu", "torch==2.13.0 --hash=sha256:aa\n")
    assert len(first) == 12
    assert first == pinset.stack_id("lab-cpu", "torch==2.13.0 --hash=sha256:aa\n")
    assert first != pinset.stack_id("lab-cpu", "torch==2.13.0 --hash=sha256:ab\n")
    assert first != pinset.stack_id("cu130", "torch==2.13.0 --hash=sha256:aa\n")


def test_install_command_offline_and_online():
    offline = pinset.install_command("/s/bin/python", "/s/lock", wheelhouse="/w")
    assert offline[:4] == ["/s/bin/python", "-m", "pip", "install"]
    assert {"--require-hashes", "--no-deps", "--only-binary=:all:", "--no-index"} <= set(offline)
    assert offline[offline.index("--find-links") + 1] == "/w" and offline[-2:] == ["-r", "/s/lock"]
    online = pinset.install_command(
        "/s/bin/python", "/s/lock", index_url="https://idx/simple", extra_index_urls=["https://x"]
    )
    assert "--no-index" not in online and online[online.index("--index-url") + 1] == "https://idx/simple"


def make_release(root, name, stack_id):
    path = os.path.join(root, "releases", name)
    os.makedirs(path)
    with open(os.path.join(path, "manifest.json"), "w") as handle:
        json.dump({"stack_id": stack_id}, handle)
    return path


def test_prune_keeps_what_services_use(tmp_path):
    root = str(tmp_path)
    for stack in ("aaa", "bbb", "ccc", "ddd"):
        os.makedirs(os.path.join(root, "stacks", stack))
    open(os.path.join(root, "stacks", "aaa", layout.STACK_MARKER), "w").close()
    r1, r2 = make_release(root, "r1", "bbb"), make_release(root, "r2", "ccc")
    os.makedirs(os.path.join(root, "services", "coder"))
    os.symlink(r1, os.path.join(root, "services", "coder", "current"))
    os.symlink(r2, os.path.join(root, "services", "coder", "previous"))
    in_use = layout.release_stack_ids(os.path.join(root, "services"), os.path.join(root, "releases"))
    assert in_use == {"bbb": ["coder/current"], "ccc": ["coder/previous"]}
    existing = layout.existing_stacks(os.path.join(root, "stacks"))
    assert existing == {"aaa": True, "bbb": False, "ccc": False, "ddd": False}
    assert layout.unused(existing, keep=["aaa"], in_use=in_use) == ["ddd"]


def test_missing_roots_mean_nothing_in_use(tmp_path):
    assert layout.release_stack_ids(str(tmp_path / "none"), str(tmp_path / "none")) == {}
    assert layout.existing_stacks(str(tmp_path / "none")) == {}
